//! The stack's PKI: one CA, one admin identity that doubles as the API server's serving
//! certificate, and client certificates for restricted users.
//!
//! ```text
//! ca.crt/ca.key --signs--> admin.crt/admin.key  (CN=admin, O=system:masters,
//!                                                SANs localhost/127.0.0.1/::1, server+client)
//!               --signs--> users/<user>.crt     (CN=<user>, O=<group>..., client only)
//! ```
//!
//! The CA is rebuilt from `ca.key` and fixed parameters, so a stack started by an earlier
//! process (the persistent `cluster-up` stack) can still issue user certificates.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// Common name of the stack's CA.
const CA_NAME: &str = "gpu-defrag-e2e-ca";

/// File locations of the PKI inside a work dir.
#[derive(Debug, Clone)]
pub struct Pki {
    /// `pki/` directory.
    pub dir: PathBuf,
    /// CA certificate (PEM).
    pub ca_crt: PathBuf,
    /// CA private key (PEM, PKCS#8).
    pub ca_key: PathBuf,
    /// Admin / serving certificate (PEM).
    pub admin_crt: PathBuf,
    /// Admin / serving key (PEM, PKCS#8); also the service-account signing key.
    pub admin_key: PathBuf,
    /// Public half of `admin_key` (service-account token verification).
    pub sa_pub: PathBuf,
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn leaf_params(
    cn: &str,
    groups: &[&str],
    sans: &[&str],
    server: bool,
) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .context("certificate subject alternative names")?;
    let mut dn = DistinguishedName::new();
    for group in groups {
        dn.push(DnType::OrganizationName, *group);
    }
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    if server {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    Ok(params)
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod {}", path.display()))?;
    }
    Ok(())
}

impl Pki {
    /// Paths of the PKI under `work_dir/pki`, without creating anything.
    pub fn at(work_dir: &Path) -> Self {
        let dir = work_dir.join("pki");
        Self {
            ca_crt: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            admin_crt: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_pub: dir.join("sa.pub"),
            dir,
        }
    }

    /// Creates the CA and the admin identity under `work_dir/pki`.
    pub fn create(work_dir: &Path) -> Result<Self> {
        let pki = Self::at(work_dir);
        fs::create_dir_all(&pki.dir).with_context(|| format!("creating {}", pki.dir.display()))?;
        let ca_key = KeyPair::generate().context("generating the CA key")?;
        let ca_cert = ca_params().self_signed(&ca_key).context("signing the CA")?;
        fs::write(&pki.ca_crt, ca_cert.pem()).context("writing ca.crt")?;
        write_private(&pki.ca_key, &ca_key.serialize_pem())?;
        pki.issue(
            "admin",
            &["system:masters"],
            &[
                "localhost",
                "127.0.0.1",
                "::1",
                "kubernetes",
                "kubernetes.default.svc",
            ],
            true,
            &pki.admin_crt,
            &pki.admin_key,
        )?;
        let admin = fs::read_to_string(&pki.admin_key).context("reading admin.key")?;
        let admin = KeyPair::from_pem(&admin).context("parsing admin.key")?;
        fs::write(&pki.sa_pub, admin.public_key_pem()).context("writing sa.pub")?;
        Ok(pki)
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>> {
        let pem = fs::read_to_string(&self.ca_key)
            .with_context(|| format!("reading {}", self.ca_key.display()))?;
        let key = KeyPair::from_pem(&pem).context("parsing the CA key")?;
        Ok(Issuer::new(ca_params(), key))
    }

    /// Issues a certificate for `cn` in `groups`, signed by the CA, written to `crt`/`key`.
    pub fn issue(
        &self,
        cn: &str,
        groups: &[&str],
        sans: &[&str],
        server: bool,
        crt: &Path,
        key: &Path,
    ) -> Result<()> {
        let issuer = self.issuer()?;
        let leaf_key = KeyPair::generate().context("generating a key")?;
        let cert = leaf_params(cn, groups, sans, server)?
            .signed_by(&leaf_key, &issuer)
            .with_context(|| format!("signing the certificate of {cn}"))?;
        fs::write(crt, cert.pem()).with_context(|| format!("writing {}", crt.display()))?;
        write_private(key, &leaf_key.serialize_pem())
    }

    /// The CA certificate in DER form (for kube's `Config::root_cert`).
    pub fn ca_der(&self) -> Result<Vec<u8>> {
        let pem = fs::read_to_string(&self.ca_crt)
            .with_context(|| format!("reading {}", self.ca_crt.display()))?;
        pem_to_der(&pem)
    }
}

/// Decodes the first PEM block of `pem`.
fn pem_to_der(pem: &str) -> Result<Vec<u8>> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64_decode(body.trim()).context("decoding PEM")
}

fn base64_decode(s: &str) -> Result<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some((c - b'A') as u32),
            b'a'..=b'z' => Some((c - b'a' + 26) as u32),
            b'0'..=b'9' => Some((c - b'0' + 52) as u32),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| !c.is_ascii_whitespace()) {
        if c == b'=' {
            break;
        }
        let v =
            val(c).ok_or_else(|| anyhow::anyhow!("invalid base64 character {:?}", c as char))?;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_roundtrip_known_values() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8gd29ybGQ=").unwrap(), b"hello world");
        assert!(base64_decode("a$b").is_err());
    }

    #[test]
    fn pki_issues_certificates_signed_by_the_ca() {
        let dir = std::env::temp_dir().join(format!("gpu-defrag-pki-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let pki = Pki::create(&dir).unwrap();
        let der = pki.ca_der().unwrap();
        assert_eq!(der[0], 0x30, "DER starts with a SEQUENCE");
        let (crt, key) = (pki.dir.join("u.crt"), pki.dir.join("u.key"));
        pki.issue("alice", &["team-a"], &[], false, &crt, &key)
            .unwrap();
        assert!(
            fs::read_to_string(&crt)
                .unwrap()
                .contains("BEGIN CERTIFICATE")
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
