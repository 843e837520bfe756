//! ResourceClaims: the claims a pod names, and each claim's allocation results,
//! `reservedFor` pods and exact requests.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::slices::amount;

/// A pod's claims, as its spec and status name them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodClaims {
    /// `spec.resourceClaims`: (name in the pod, `resourceClaimName` when named).
    pub spec: Vec<(String, Option<String>)>,
    /// `status.resourceClaimStatuses`: name in the pod → generated claim (None: none needed).
    pub status: BTreeMap<String, Option<String>>,
    /// `status.extendedResourceClaimStatus.resourceClaimName`.
    pub extended: Option<String>,
}

impl PodClaims {
    /// Reads them from a pod.
    pub fn of(pod: &corev1::Pod) -> PodClaims {
        let spec = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .into_iter()
            .flatten()
            .map(|c| (c.name.clone(), c.resource_claim_name.clone()))
            .collect();
        let status = pod.status.as_ref();
        PodClaims {
            spec,
            status: status
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .into_iter()
                .flatten()
                .map(|c| (c.name.clone(), c.resource_claim_name.clone()))
                .collect(),
            extended: status
                .and_then(|s| s.extended_resource_claim_status.as_ref())
                .map(|e| e.resource_claim_name.clone()),
        }
    }

    /// Whether the pod has any claim at all.
    pub fn any(&self) -> bool {
        !self.spec.is_empty() || self.extended.is_some()
    }

    /// The claim objects the pod uses: (claim name, named in the spec). A template
    /// claim whose generated name is not recorded yet is `Err(name in the pod)`.
    pub fn names(&self) -> Vec<Result<(String, bool), String>> {
        let mut out = Vec::new();
        for (name, named) in &self.spec {
            match named {
                Some(c) => out.push(Ok((c.clone(), true))),
                None => match self.status.get(name) {
                    Some(Some(c)) => out.push(Ok((c.clone(), false))),
                    // Recorded as "no claim needed" (a template that was not used).
                    Some(None) => {}
                    None => out.push(Err(name.clone())),
                },
            }
        }
        if let Some(e) = &self.extended {
            out.push(Ok((e.clone(), false)));
        }
        out
    }
}

/// An allocation result of a claim, as read.
#[derive(Debug, Clone)]
pub(crate) struct AllocResult {
    pub(super) driver: String,
    pub(super) pool: String,
    pub(super) device: String,
    pub(super) share: bool,
    pub(super) consumed: BTreeMap<String, u64>,
    pub(super) bad: Option<String>,
}

/// A claim, as read.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    /// Allocation results (None: not allocated).
    results: Option<Vec<AllocResult>>,
    /// `reservedFor` pods: (name, uid).
    reserved: Vec<(String, String)>,
    /// Exact requests: (device class, count), for pending pods' shapes (None: a request
    /// whose count cannot be told — `All`, `firstAvailable`).
    requests: Vec<Option<(String, u64)>>,
}

/// Reads one claim.
pub(super) fn read_claim(c: &ResourceClaim) -> Claim {
    let status = c.status.as_ref();
    let results = status.and_then(|s| s.allocation.as_ref()).map(|a| {
        a.devices
            .as_ref()
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .map(|r| {
                let mut bad = None;
                let mut consumed = BTreeMap::new();
                for (k, q) in r.consumed_capacity.iter().flatten() {
                    match amount(&q.0) {
                        Ok(v) => {
                            consumed.insert(k.clone(), v);
                        }
                        Err(e) => {
                            bad.get_or_insert(format!("consumedCapacity {k}: {e}"));
                        }
                    }
                }
                AllocResult {
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    share: r.share_id.is_some() || !consumed.is_empty(),
                    consumed,
                    bad,
                }
            })
            .collect()
    });
    let reserved = status
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| (r.name.clone(), r.uid.clone()))
        .collect();
    let requests = c
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|r| {
            let e = r.exactly.as_ref()?;
            if e.allocation_mode
                .as_deref()
                .is_some_and(|m| m != "ExactCount")
            {
                return None;
            }
            let count = u64::try_from(e.count.unwrap_or(1)).ok()?;
            Some((e.device_class_name.clone(), count))
        })
        .collect();
    Claim {
        results,
        reserved,
        requests,
    }
}

impl Claim {
    /// Its allocation results (None: not allocated).
    pub(crate) fn results(&self) -> Option<&[AllocResult]> {
        self.results.as_deref()
    }

    /// Whether `reservedFor` holds the pod (by UID when both are known, else by name).
    pub(crate) fn reserved_for(&self, name: &str, uid: &str) -> bool {
        self.reserved.iter().any(|(n, u)| {
            if uid.is_empty() || u.is_empty() {
                n == name
            } else {
                u == uid
            }
        })
    }

    /// How many pods it is reserved for.
    pub(crate) fn consumers(&self) -> usize {
        self.reserved.len()
    }

    /// Its exact requests: (device class, count); None for one whose count cannot be told.
    pub(crate) fn requests(&self) -> &[Option<(String, u64)>] {
        &self.requests
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_claims_name_their_claim_objects() {
        let pod: corev1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "a", "resourceClaimTemplateName": "t"},
                {"name": "b", "resourceClaimName": "shared"},
                {"name": "c", "resourceClaimTemplateName": "t"},
                {"name": "d", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [
                {"name": "a", "resourceClaimName": "p-a-x"}, {"name": "c"}],
                "extendedResourceClaimStatus": {"resourceClaimName": "p-ext", "requestMappings": []}}
        }))
        .unwrap();
        let c = PodClaims::of(&pod);
        assert!(c.any());
        assert_eq!(
            c.names(),
            [
                Ok(("p-a-x".to_string(), false)),
                Ok(("shared".to_string(), true)),
                Err("d".to_string()),
                Ok(("p-ext".to_string(), false)),
            ]
        );
        assert!(!PodClaims::default().any());
    }
}
