//! Why a GPU pod is not movable: the skip codes, stable across status, metrics and docs.

use serde::Serialize;

#[cfg(doc)]
use super::movable;

/// Why a pod is not movable. Codes are stable (status, metrics, docs); a `Skip`
/// serialises as its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Skip {
    /// Namespace or pod selector of the policy excludes it.
    OutOfScope,
    /// Its GPU allocation could not be read.
    UnknownAllocation,
    /// Its node has unknown or contradictory records: never drained.
    NodeUndrainable,
    /// Being deleted.
    Terminating,
    /// Not Running.
    NotRunning,
    /// Mirror or static pod.
    MirrorPod,
    /// Placed by a scheduler not listed in `safety.binpackSchedulers`: where its
    /// replacement would land cannot be predicted.
    SchedulerNotBinpacking,
    /// No controller would recreate it.
    NoController,
    /// Owned by a DaemonSet.
    DaemonSet,
    /// Owned by a Job and the policy does not allow it.
    JobPod,
    /// Uses local storage and the policy does not allow it.
    LocalStorage,
    /// Priority above the policy's threshold.
    Priority,
    /// Priority class protected by the policy.
    ProtectedClass,
    /// `gpu-defrag.io/do-not-disrupt` or `karpenter.sh/do-not-disrupt`.
    OptOut,
    /// Younger than `safety.minPodAge`.
    TooYoung,
    /// Matched by more than one PodDisruptionBudget (the Eviction API refuses it).
    MultiplePdbs,
    /// Its PodDisruptionBudget allows no disruption now.
    PdbExhausted,
    /// A KAI reservation pod (it belongs to the scheduler, not to a workload).
    KaiReservation,
    /// Already evicted in this run.
    AlreadyMoved,
    /// Not Ready: it serves nothing now, and its replacement would not either.
    NotReady,
    /// Owned by a controller gpu-defrag does not know to recreate it as it was (a
    /// training job, a workflow, an unknown CRD, …) and not listed in
    /// `safety.movableOwnerKinds`.
    CustomController,
    /// An owner object of its chain is missing or unreadable.
    OwnerUnknown,
    /// A member of a gang: evicting it restarts or stalls the whole group.
    Gang,
    /// It names a pod group that cannot be read: it may be a gang.
    GangUnknown,
    /// Its Namespace carries `gpu-defrag.io/do-not-disrupt`.
    NamespaceOptOut,
    /// Mounts a PersistentVolumeClaim and `safety.evictPvcPods` is off.
    Pvc,
    /// Has a generic ephemeral volume and `safety.evictEphemeralVolumePods` is off.
    EphemeralVolume,
    /// Holds Dynamic Resource Allocation claims gpu-defrag cannot judge (not read, not
    /// allocated, or holding devices the planner does not place: MIG partitions,
    /// consumable-capacity shares, other drivers' devices).
    ResourceClaim,
    /// Uses a claim named in its spec (`resourceClaimName`): the claim stays allocated
    /// on its node, so the replacement could only land back there.
    NamedClaim,
    /// Uses a claim other pods use too: its devices stay allocated while any of them runs.
    SharedClaim,
    /// Its PodDisruptionBudget's status is behind its spec.
    PdbStale,
    /// Its workload already has `limits.maxUnavailablePerWorkload` replicas unavailable
    /// (not Ready, Pending or terminating), counted from live state.
    WorkloadUnavailable,
    /// The only Ready replica of its workload, and no PDB allows its disruption.
    LastReadyReplica,
    /// Where its replacement may run cannot be proven: a scheduling constraint of it the
    /// scheduler emulation cannot evaluate from the model (a pod (anti-)affinity term with
    /// a `namespaceSelector` over namespace labels, an unknown spread policy).
    NoTarget,
}

impl Skip {
    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Skip::OutOfScope => "out-of-scope",
            Skip::UnknownAllocation => "unknown-allocation",
            Skip::NodeUndrainable => "node-undrainable",
            Skip::Terminating => "terminating",
            Skip::NotRunning => "not-running",
            Skip::MirrorPod => "mirror-pod",
            Skip::SchedulerNotBinpacking => "scheduler-not-binpacking",
            Skip::NoController => "no-controller",
            Skip::DaemonSet => "daemonset",
            Skip::JobPod => "job-pod",
            Skip::LocalStorage => "local-storage",
            Skip::Priority => "priority-above-threshold",
            Skip::ProtectedClass => "protected-priority-class",
            Skip::OptOut => "opted-out",
            Skip::TooYoung => "too-young",
            Skip::MultiplePdbs => "multiple-pdbs",
            Skip::PdbExhausted => "pdb-exhausted",
            Skip::KaiReservation => "kai-reservation",
            Skip::AlreadyMoved => "already-moved",
            Skip::NotReady => "not-ready",
            Skip::CustomController => "custom-controller",
            Skip::OwnerUnknown => "owner-unknown",
            Skip::Gang => "gang",
            Skip::GangUnknown => "gang-unknown",
            Skip::NamespaceOptOut => "namespace-opted-out",
            Skip::Pvc => "pvc",
            Skip::EphemeralVolume => "ephemeral-volume",
            Skip::ResourceClaim => "resource-claim",
            Skip::NamedClaim => "named-resource-claim",
            Skip::SharedClaim => "shared-resource-claim",
            Skip::PdbStale => "pdb-stale",
            Skip::WorkloadUnavailable => "workload-unavailable",
            Skip::LastReadyReplica => "last-ready-replica",
            Skip::NoTarget => "no-target",
        }
    }

    /// Every skip, in the order [`movable`] checks them (docs and tests list them all).
    pub const ALL: &'static [Skip] = &[
        Skip::OutOfScope,
        Skip::UnknownAllocation,
        Skip::NodeUndrainable,
        Skip::Terminating,
        Skip::NotRunning,
        Skip::NotReady,
        Skip::MirrorPod,
        Skip::KaiReservation,
        Skip::NoController,
        Skip::DaemonSet,
        Skip::OwnerUnknown,
        Skip::CustomController,
        Skip::JobPod,
        Skip::Gang,
        Skip::GangUnknown,
        Skip::NamespaceOptOut,
        Skip::LocalStorage,
        Skip::Pvc,
        Skip::EphemeralVolume,
        Skip::NoTarget,
        Skip::SharedClaim,
        Skip::NamedClaim,
        Skip::ResourceClaim,
        Skip::SchedulerNotBinpacking,
        Skip::ProtectedClass,
        Skip::Priority,
        Skip::OptOut,
        Skip::TooYoung,
        Skip::AlreadyMoved,
        Skip::MultiplePdbs,
        Skip::PdbStale,
        Skip::PdbExhausted,
        Skip::WorkloadUnavailable,
        Skip::LastReadyReplica,
    ];
}

impl Serialize for Skip {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}
