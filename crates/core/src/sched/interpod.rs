//! InterPodAffinity and PodTopologySpread: the filters that depend on where other pods
//! are. [`Incoming`] reads the cluster once for one pod (its terms' matching pods per
//! topology domain, the existing pods' anti-affinity against it, the spread counts), then
//! answers for any node.
use std::collections::{HashMap, HashSet};

use super::{Filter, Fit, Free, Occupancy, own_fit};
use crate::model::*;

/// Whether `term` (its namespaces resolved at ingest) matches pod `q`: its labels match
/// the selector and its namespace is among the term's (None: cannot be told).
fn term_matches(term: &PodAffinityTerm, q: &Pod) -> Option<bool> {
    let Some(sel) = &term.selector else {
        return Some(false);
    };
    if !sel.matches(&q.labels) {
        return Some(false);
    }
    term.namespaces.contains(&q.namespace)
}

/// The pods a term of the incoming pod is about: namespaces it names, or every namespace.
fn candidates<'o>(occ: &'o Occupancy, ns: &TermNamespaces) -> Vec<&'o [usize]> {
    match ns {
        TermNamespaces::List(l) => l.iter().map(|n| occ.in_namespace(n)).collect(),
        TermNamespaces::All | TermNamespaces::Unread => {
            occ.by_ns.values().map(Vec::as_slice).collect()
        }
    }
}

/// One spread constraint, counted: matching pods per domain among the eligible nodes.
struct Spread {
    key: String,
    max_skew: u32,
    self_match: u32,
    /// Domain value → matching pods.
    counts: HashMap<String, u32>,
    /// The smallest count over the domains (0 when there are fewer than `minDomains`).
    min: u32,
}

/// One pod about to be placed, with what its inter-pod filters need read once.
pub struct Incoming<'a> {
    c: &'a Cluster,
    occ: &'a Occupancy,
    pod: usize,
    /// What cannot be evaluated, when something cannot.
    unknown: Option<String>,
    /// Existing pods' anti-affinity against it: (topology key, value) it may not join.
    existing_anti: HashSet<(String, String)>,
    /// Same, where the holder's namespaces cannot be read: unknown there.
    existing_anti_unread: HashSet<(String, String)>,
    /// Its affinity terms: (topology key, domains with a pod that matches every term).
    affinity: Vec<(String, HashSet<String>)>,
    /// No pod anywhere (on a node with the terms' keys) matches all its affinity terms,
    /// and it matches them all itself:
    /// the first of a group may go anywhere its topology keys exist.
    first_of_group: bool,
    /// Its anti-affinity terms: (topology key, domains with a matching pod).
    anti: Vec<(String, HashSet<String>)>,
    spread: Vec<Spread>,
    /// Nothing beyond its own requests to check (no inter-pod constraint of its own, no
    /// placed pod's anti-affinity against it, nothing unknown).
    simple: bool,
}

impl<'a> Incoming<'a> {
    /// Reads what pod `pod`'s placement depends on in `c` as `occ` has it.
    pub fn new(c: &'a Cluster, occ: &'a Occupancy, pod: usize) -> Incoming<'a> {
        let p = &c.pods[pod];
        let cs = p.constraints();
        let mut inc = Incoming {
            c,
            occ,
            pod,
            unknown: cs.unreadable.clone(),
            existing_anti: HashSet::new(),
            existing_anti_unread: HashSet::new(),
            affinity: Vec::new(),
            first_of_group: false,
            anti: Vec::new(),
            spread: Vec::new(),
            simple: false,
        };
        // Existing pods' required anti-affinity against this pod.
        for &h in &occ.holders {
            if h == pod {
                continue;
            }
            let Some(m) = occ.node_of(h) else { continue };
            let node = &c.nodes[m];
            for term in &c.pods[h].constraints().anti_affinity {
                let Some(v) = node.labels.get(&term.topology_key) else {
                    continue;
                };
                let pair = (term.topology_key.clone(), v.clone());
                match term_matches(term, p) {
                    Some(true) => {
                        inc.existing_anti.insert(pair);
                    }
                    Some(false) => {}
                    None => {
                        inc.existing_anti_unread.insert(pair);
                    }
                }
            }
        }
        if inc.unknown.is_some() || !cs.inter_pod() {
            inc.simple = inc.unknown.is_none()
                && inc.existing_anti.is_empty()
                && inc.existing_anti_unread.is_empty();
            return inc;
        }
        let domains_of = |term: &PodAffinityTerm| -> HashSet<String> {
            let mut out = HashSet::new();
            for list in candidates(occ, &term.namespaces) {
                for &q in list {
                    if q == pod {
                        continue;
                    }
                    let Some(m) = occ.node_of(q) else { continue };
                    if term_matches(term, &c.pods[q]) == Some(true)
                        && let Some(v) = c.nodes[m].labels.get(&term.topology_key)
                    {
                        out.insert(v.clone());
                    }
                }
            }
            out
        };
        // Affinity counts only the pods that match *every* affinity term of the pod (as
        // kube-scheduler does): each term's domain must hold such a pod, not just a pod
        // matching that term alone.
        inc.affinity = cs
            .affinity
            .iter()
            .map(|t| (t.topology_key.clone(), HashSet::new()))
            .collect();
        if let Some(first) = cs.affinity.first() {
            for list in candidates(occ, &first.namespaces) {
                for &q in list {
                    let Some(m) = occ.node_of(q).filter(|_| q != pod) else {
                        continue;
                    };
                    let other = &c.pods[q];
                    if !cs
                        .affinity
                        .iter()
                        .all(|t| term_matches(t, other) == Some(true))
                    {
                        continue;
                    }
                    for (t, (_, domains)) in cs.affinity.iter().zip(inc.affinity.iter_mut()) {
                        if let Some(v) = c.nodes[m].labels.get(&t.topology_key) {
                            domains.insert(v.clone());
                        }
                    }
                }
            }
        }
        inc.first_of_group = !cs.affinity.is_empty()
            && inc.affinity.iter().all(|(_, d)| d.is_empty())
            && cs.affinity.iter().all(|t| term_matches(t, p) == Some(true));
        inc.anti = cs
            .anti_affinity
            .iter()
            .map(|t| (t.topology_key.clone(), domains_of(t)))
            .collect();
        if !cs.spread.is_empty() {
            inc.spread = spread_counts(c, occ, pod, &cs.spread);
        }
        inc
    }

    /// The verdict on node `n` with `free` free there now.
    pub fn fit(&self, n: usize, free: Free<'_>) -> Fit {
        let own = own_fit(self.c, self.occ, self.pod, n, free);
        if !own.fits() || self.simple {
            return own;
        }
        if let Some(u) = &self.unknown {
            return Fit::Unknown(u.clone());
        }
        let labels = &self.c.nodes[n].labels;
        // The affinity counts only register domains where the node has the key, and the
        // scheduler needs every term's key on the node.
        let mut all_present = true;
        for (key, domains) in &self.affinity {
            match labels.get(key) {
                None => return Fit::No(Filter::InterPodAffinity),
                Some(v) => all_present &= domains.contains(v),
            }
        }
        if !all_present && !self.first_of_group {
            return Fit::No(Filter::InterPodAffinity);
        }
        for (key, domains) in &self.anti {
            if labels.get(key).is_some_and(|v| domains.contains(v)) {
                return Fit::No(Filter::InterPodAntiAffinity);
            }
        }
        if self
            .existing_anti
            .iter()
            .any(|(k, v)| labels.get(k) == Some(v))
        {
            return Fit::No(Filter::InterPodAntiAffinity);
        }
        if let Some(pair) = self
            .existing_anti_unread
            .iter()
            .find(|(k, v)| labels.get(k) == Some(v))
        {
            return Fit::Unknown(format!(
                "a pod's anti-affinity with a namespaceSelector covers {}={} (namespace labels \
                 are not read)",
                pair.0, pair.1
            ));
        }
        for s in &self.spread {
            let Some(v) = labels.get(&s.key) else {
                return Fit::No(Filter::PodTopologySpread);
            };
            let here = s.counts.get(v).copied().unwrap_or(0);
            if (here + s.self_match).saturating_sub(s.min) > s.max_skew {
                return Fit::No(Filter::PodTopologySpread);
            }
        }
        own
    }
}

/// PodTopologySpread's counts for pod `pod`: for each constraint, matching pods of its
/// namespace (not terminating) per domain, over the nodes that have every constraint's
/// key and (per the node policies) that the pod's node affinity allows and whose taints
/// it tolerates.
fn spread_counts(
    c: &Cluster,
    occ: &Occupancy,
    pod: usize,
    cons: &[SpreadConstraint],
) -> Vec<Spread> {
    let p = &c.pods[pod];
    // Matching pods per node, per constraint.
    let mut per_node: Vec<HashMap<usize, u32>> = vec![HashMap::new(); cons.len()];
    for &q in occ.in_namespace(&p.namespace) {
        if q == pod || c.pods[q].deleting {
            continue;
        }
        let Some(m) = occ.node_of(q) else { continue };
        for (i, s) in cons.iter().enumerate() {
            // An empty selector counts no pod (kube-scheduler's countPodsMatchSelector),
            // though the pod itself matches it.
            if s.selector
                .as_ref()
                .is_some_and(|sel| !sel.is_empty() && sel.matches(&c.pods[q].labels))
            {
                *per_node[i].entry(m).or_default() += 1;
            }
        }
    }
    let mut out: Vec<Spread> = cons
        .iter()
        .map(|s| Spread {
            key: s.topology_key.clone(),
            max_skew: s.max_skew,
            self_match: u32::from(
                s.selector
                    .as_ref()
                    .is_some_and(|sel| sel.matches(&p.labels)),
            ),
            counts: HashMap::new(),
            min: 0,
        })
        .collect();
    for (n, node) in c.nodes.iter().enumerate() {
        if !cons
            .iter()
            .all(|s| node.labels.contains_key(&s.topology_key))
        {
            continue;
        }
        for (i, s) in cons.iter().enumerate() {
            if s.honor_node_affinity && !super::node_affinity_allows(p, node) {
                continue;
            }
            if s.honor_taints && !super::taints_tolerated(p, node) {
                continue;
            }
            let v = &node.labels[&s.topology_key];
            *out[i].counts.entry(v.clone()).or_default() +=
                per_node[i].get(&n).copied().unwrap_or(0);
        }
    }
    for (s, con) in out.iter_mut().zip(cons) {
        let domains = s.counts.len() as u32;
        s.min = if con.min_domains.is_some_and(|m| domains < m) {
            0
        } else {
            s.counts.values().copied().min().unwrap_or(0)
        };
    }
    out
}
