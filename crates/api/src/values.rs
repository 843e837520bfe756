//! The fixed string values the operator writes into status: run results, condition
//! types and condition reasons. Each is an enum with `as_str()`; the field docs of the CRD
//! list every value (a test checks they stay in step).

/// Defines a string-valued enum: `as_str()`, `ALL`, `Display`.
macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value as written into status.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant)),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum! {
    /// How a run ended (`status.lastRuns[].result`; `Running` while it lasts).
    RunResult {
        /// In progress.
        Running,
        /// Every planned move done.
        Succeeded,
        /// Some moves were blocked, failed or bounced.
        Partial,
        /// A replacement was not Ready within `rescheduleTimeout`.
        Stalled,
        /// Stopped by a safety guard (pending GPU pods piling up).
        Stopped,
        /// The window closed; moves in flight were finished.
        WindowClosed,
        /// Every move done, but the fragment rate fell by less than half of what the plan
        /// forecast (measured without the GPU pods that were pending when the run started:
        /// capacity they took is benefit realised).
        BenefitNotRealized,
        /// Ended without finishing: the policy became invalid or changed, leadership was
        /// lost, or the operator restarted outside the run's window.
        Aborted,
    }
}

string_enum! {
    /// What became of a demand decision (`status.demand.recent[].result`).
    DemandResult {
        /// The run is in progress.
        Running,
        /// Every pod bound on its room.
        Served,
        /// No room can be made within the rules and limits.
        NoRoom,
        /// The search ran out of steps, or the hourly allowance is spent.
        BudgetSpent,
        /// A pod did not bind on its room within `holdTimeout`, or the run ended otherwise.
        Stalled,
    }
}

string_enum! {
    /// The condition types of a DefragPolicy.
    ConditionType {
        /// The policy was reconciled (False: the spec or a window is invalid).
        Ready,
        /// A maintenance window is open.
        InWindow,
        /// A run is in progress.
        Executing,
        /// Part of the plan would be refused, or GPU pods are unreadable.
        Degraded,
        /// An older policy covers some of the same nodes.
        Conflict,
        /// GPU activity data from Prometheus (only with `--prometheus-url`).
        IdleData,
    }
}

string_enum! {
    /// The reasons of the conditions.
    Reason {
        /// `Ready=True`.
        Reconciled,
        /// The spec is invalid.
        InvalidSpec,
        /// A window is invalid.
        InvalidWindow,
        /// `InWindow=True`.
        WindowOpen,
        /// `InWindow=False` until the next window.
        WindowClosed,
        /// No window is configured.
        NoWindow,
        /// `Executing=True`.
        RunInProgress,
        /// `Executing=False`; the message says why.
        NotExecuting,
        /// `Degraded=True`.
        PlanPartlyBlocked,
        /// `Degraded=True`: the policy covers no node with GPUs, so nothing is measured.
        NoGpuNodes,
        /// `Degraded=False`.
        AsExpected,
        /// `Conflict=True`.
        OverlappingPolicy,
        /// `Conflict=False`.
        NoOverlap,
        /// `IdleData=False`: no answer from Prometheus yet.
        NotQueriedYet,
        /// `IdleData=True`.
        Measured,
        /// `IdleData=True`, but Prometheus returned no GPU series.
        NoSeries,
        /// `IdleData=False`: Prometheus could not be reached.
        PrometheusUnreachable,
        /// `IdleData=False`: Prometheus did not answer in time.
        PrometheusTimeout,
        /// `IdleData=False`: Prometheus answered with an error.
        PrometheusError,
        /// `IdleData=False`: the answer could not be read (or was too large).
        MalformedResponse,
        /// `IdleData=False`: the credentials file could not be read.
        CredentialsUnreadable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    /// The description of a status field in the generated CRD.
    fn description(path: &[&str]) -> String {
        let crd = serde_json::to_value(crate::v1alpha1::DefragPolicy::crd()).unwrap();
        let mut v =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
        for p in path {
            v = &v["properties"][p];
            if v.get("items").is_some() {
                v = &v["items"];
            }
        }
        v["description"].as_str().unwrap_or_default().to_string()
    }

    #[test]
    fn the_crd_docs_list_every_value() {
        let result = description(&["lastRuns", "result"]);
        for r in RunResult::ALL {
            assert!(result.contains(&format!("`{r}`")), "{r} missing: {result}");
        }
        let demand = description(&["demand", "recent", "result"]);
        for r in DemandResult::ALL {
            assert!(demand.contains(&format!("`{r}`")), "{r} missing: {demand}");
        }
        let types = description(&["conditions", "type"]);
        for t in ConditionType::ALL {
            assert!(types.contains(&format!("`{t}`")), "{t} missing: {types}");
        }
        let reasons = description(&["conditions", "reason"]);
        for r in Reason::ALL {
            assert!(
                reasons.contains(&format!("`{r}`")),
                "{r} missing: {reasons}"
            );
        }
    }

    #[test]
    fn values_are_distinct() {
        let all: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(all.len(), Reason::ALL.len());
        assert_eq!(RunResult::Succeeded.as_str(), "Succeeded");
    }
}
