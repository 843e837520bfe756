//! Nodes still settling: whether a node may receive planned pods yet, and why not.

use chrono::{DateTime, Utc};

use super::SettlingNode;
use crate::model::*;
use crate::policy::{Policy, duration_text};

/// Whether node `n` may receive planned pods: not while it is still starting up or
/// younger than `safety.minNodeAge` (measured at `now`; no clock, no age check).
pub fn warm(node: &Node, policy: &Policy, now: Option<DateTime<Utc>>) -> bool {
    settling(node, policy, now).is_none()
}

/// Why node `n` receives no planned pod yet ([`warm`]), if it does not.
pub fn settling(node: &Node, policy: &Policy, now: Option<DateTime<Utc>>) -> Option<String> {
    if let Some(s) = &node.starting {
        return Some(s.clone());
    }
    let now = now.filter(|_| !policy.min_node_age.is_zero())?;
    let Some(since) = node.ready_since else {
        return Some("not Ready".into());
    };
    let age = (now - since).to_std().unwrap_or_default();
    (age < policy.min_node_age).then(|| {
        format!(
            "Ready for {}, under safety.minNodeAge {}",
            duration_text(age),
            duration_text(policy.min_node_age)
        )
    })
}

/// Nodes in scope that receive no planned pod yet, and why.
pub(super) fn settling_nodes(
    cluster: &Cluster,
    counted: &[bool],
    policy: &Policy,
    now: Option<DateTime<Utc>>,
) -> Vec<SettlingNode> {
    cluster
        .nodes
        .iter()
        .zip(counted)
        .filter(|(_, c)| **c)
        .filter_map(|(n, _)| {
            settling(n, policy, now).map(|why| SettlingNode {
                node: n.name.clone(),
                why,
            })
        })
        .collect()
}
