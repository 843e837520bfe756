//! NVIDIA MIG profiles as the device plugin's `mixed` strategy exposes them:
//! resources named `nvidia.com/mig-<G>g.<MEM>gb[.<attr>...]`.

use std::fmt;

/// Prefix of mixed-strategy MIG resource names.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// Longest profile name accepted.
const MAX_PROFILE_LEN: usize = 64;
/// Longest attribute suffix accepted (`.me`, `.gfx`, `.me.all`...).
const MAX_SUFFIX_LEN: usize = 32;

/// A MIG profile: `1g.10gb`, `3g.40gb`, `1g.10gb.me`...
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigProfile {
    /// Compute slices (GPCs): the `<G>` in `<G>g`. At least 1.
    pub gpc: u32,
    /// Memory in GB: the `<MEM>` in `<MEM>gb`. At least 1.
    pub mem_gb: u32,
    /// Attribute suffix, `""` or e.g. `".me"` (a `+me` profile, as resource names spell it).
    pub suffix: String,
}

impl MigProfile {
    /// The profile's name as it appears after `nvidia.com/mig-`: `"1g.10gb"`, `"1g.10gb.me"`.
    pub fn name(&self) -> String {
        format!("{}g.{}gb{}", self.gpc, self.mem_gb, self.suffix)
    }

    /// The mixed-strategy resource name: `"nvidia.com/mig-1g.10gb"`.
    pub fn resource_name(&self) -> String {
        format!("{MIG_RESOURCE_PREFIX}{}", self.name())
    }
}

impl fmt::Display for MigProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}g.{}gb{}", self.gpc, self.mem_gb, self.suffix)
    }
}

/// `nvidia.com/mig-1g.10gb`, `nvidia.com/mig-3g.40gb`, `nvidia.com/mig-1g.10gb.me` →
/// `Some(profile)`; any other name (including `nvidia.com/gpu`) → `None`.
pub fn parse_mig_resource(name: &str) -> Option<MigProfile> {
    let rest = name.strip_prefix(MIG_RESOURCE_PREFIX)?;
    if rest.contains('+') {
        return None; // not a valid resource name
    }
    parse_mig_profile(rest)
}

/// A bare profile name: `1g.10gb`, `1g.10gb.me`, or NVIDIA's own spelling `1g.10gb+me`
/// (normalised to the `.me` suffix resource names use). Numbers have no leading zeros, so
/// `MigProfile::name` gives back the canonical spelling. `None` when it is not a profile.
pub fn parse_mig_profile(p: &str) -> Option<MigProfile> {
    if p.len() > MAX_PROFILE_LEN {
        return None;
    }
    let (gpc, rest) = leading_number(p, 2)?;
    let rest = rest.strip_prefix("g.")?;
    let (mem_gb, rest) = leading_number(rest, 5)?;
    let suffix = rest.strip_prefix("gb")?;
    if suffix.len() > MAX_SUFFIX_LEN || !valid_suffix(suffix) {
        return None;
    }
    Some(MigProfile {
        gpc,
        mem_gb,
        suffix: suffix.replace('+', "."),
    })
}

/// A positive decimal of at most `max_digits` digits without leading zeros, and the rest.
fn leading_number(s: &str, max_digits: usize) -> Option<(u32, &str)> {
    let n = s.bytes().take_while(u8::is_ascii_digit).count();
    if n == 0 || n > max_digits || s.starts_with('0') {
        return None;
    }
    let v: u32 = s[..n].parse().ok()?;
    Some((v, &s[n..]))
}

/// `""` or segments `[.+-]<lowercase alnum>+`.
fn valid_suffix(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !matches!(b[i], b'.' | b'+' | b'-') {
            return false;
        }
        i += 1;
        let start = i;
        while i < b.len() && (b[i].is_ascii_lowercase() || b[i].is_ascii_digit()) {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(gpc: u32, mem_gb: u32, suffix: &str) -> MigProfile {
        MigProfile {
            gpc,
            mem_gb,
            suffix: suffix.into(),
        }
    }

    #[test]
    fn resources() {
        assert_eq!(
            parse_mig_resource("nvidia.com/mig-1g.10gb"),
            Some(p(1, 10, ""))
        );
        assert_eq!(
            parse_mig_resource("nvidia.com/mig-3g.40gb"),
            Some(p(3, 40, ""))
        );
        assert_eq!(
            parse_mig_resource("nvidia.com/mig-7g.80gb"),
            Some(p(7, 80, ""))
        );
        assert_eq!(
            parse_mig_resource("nvidia.com/mig-1g.10gb.me"),
            Some(p(1, 10, ".me"))
        );
        assert_eq!(
            parse_mig_resource("nvidia.com/mig-1g.24gb.me.all"),
            Some(p(1, 24, ".me.all"))
        );
        assert_eq!(
            parse_mig_resource("nvidia.com/mig-1g.5gb").unwrap().name(),
            "1g.5gb"
        );
        assert_eq!(
            parse_mig_resource("nvidia.com/mig-1g.10gb.me")
                .unwrap()
                .resource_name(),
            "nvidia.com/mig-1g.10gb.me"
        );
        assert_eq!(p(2, 20, "").to_string(), "2g.20gb");
        for other in [
            "nvidia.com/gpu",
            "nvidia.com/mig-",
            "nvidia.com/mig-1g",
            "nvidia.com/mig-1g.10",
            "nvidia.com/mig-1g.10GB",
            "nvidia.com/mig-0g.10gb",
            "nvidia.com/mig-01g.10gb",
            "nvidia.com/mig-1g.010gb",
            "nvidia.com/mig-1g.0gb",
            "nvidia.com/mig-1g.10gb.",
            "nvidia.com/mig-1g.10gb.ME",
            "nvidia.com/mig-1g.10gb+me",
            "nvidia.com/mig-1g.10gbx",
            "nvidia.com/mig-99999999999999999999g.10gb",
            "nvidia.com/mig-1g.10gb ",
            "nvidia.com/mig-１g.10gb",
            "NVIDIA.com/mig-1g.10gb",
            "nvidia.com/mig.config",
            "nvidia.com/mig-strategy",
            "",
        ] {
            assert_eq!(parse_mig_resource(other), None, "{other:?}");
        }
        let long = format!("nvidia.com/mig-1g.10gb{}", ".me".repeat(10_000));
        assert_eq!(parse_mig_resource(&long), None);
    }

    #[test]
    fn bare_profiles() {
        assert_eq!(parse_mig_profile("1g.10gb+me"), Some(p(1, 10, ".me")));
        assert_eq!(parse_mig_profile("4g.40gb"), Some(p(4, 40, "")));
        assert_eq!(parse_mig_profile("all-1g.10gb"), None);
        // Ordering is by GPCs, then memory, then suffix.
        let mut v = vec![p(3, 40, ""), p(1, 10, ".me"), p(1, 10, ""), p(1, 5, "")];
        v.sort();
        assert_eq!(
            v,
            vec![p(1, 5, ""), p(1, 10, ""), p(1, 10, ".me"), p(3, 40, "")]
        );
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,80}", b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = parse_mig_resource(&s);
            let _ = parse_mig_resource(&format!("nvidia.com/mig-{s}"));
            let _ = parse_mig_profile(&String::from_utf8_lossy(&b));
        }

        #[test]
        fn round_trip(gpc in 1u32..=99, mem in 1u32..=99_999, suffix in "(\\.[a-z0-9]{1,4}){0,3}") {
            let prof = p(gpc, mem, &suffix);
            prop_assert_eq!(parse_mig_resource(&prof.resource_name()), Some(prof.clone()));
            prop_assert_eq!(parse_mig_profile(&prof.name()), Some(prof));
        }
    }
}
