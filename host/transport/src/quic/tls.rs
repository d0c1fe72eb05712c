//! Mutual TLS for the cluster: one CA signs every node's certificate, and a node accepts a
//! peer only if the peer's certificate chains to that CA. A node's name (`worker-1`,
//! `coordinator`) is the DNS name in its certificate's subject alternative names, so a dialer
//! checks it is talking to the node it meant, and an acceptor checks the name a dialer claims.
//!
//! Files: a CA directory holds `ca.pem` and `ca.key` (the key never leaves the machine that
//! issues certificates); a node directory holds `ca.pem`, `cert.pem` and `key.pem`.
//!
//! Names are lowercase, since certificate names match without regard to case: a CA that
//! issued `COORDINATOR` to a worker would have issued it the coordinator's name. A worker's
//! name is one DNS label ([`check_label`]). Certificates expire ([`NodeIdentity::expires_at`]):
//! a node's after the validity it was issued for, the CA's after [`CA_VALIDITY`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The protocol name both ends offer in the TLS handshake.
pub const ALPN: &[u8] = b"eddy/1";

/// Why a certificate or key could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable certificate or key.
    #[error("{path}: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A name cannot be a certificate's DNS name.
    #[error("`{0}` cannot name a node: use lowercase letters, digits, `-` and `.` (a worker: no `.`), at most 63")]
    BadName(String),
    /// Generating or signing failed.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Io { path: path.to_owned(), source })
}

fn write(path: &Path, contents: &str, private: bool) -> Result<(), TlsError> {
    let io = |source| TlsError::Io { path: path.to_owned(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(path).map_err(io)?;
    // The mode above applies only to a new file: an existing key file gets it too.
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    std::io::Write::write_all(&mut file, contents.as_bytes()).map_err(io)
}

fn invalid(path: &Path, problem: impl std::fmt::Display) -> TlsError {
    TlsError::Invalid { path: path.to_owned(), problem: problem.to_string() }
}

/// How long a node certificate is valid unless its issuer says otherwise (`eddy cluster cert
/// --days`; enrollment issues shorter ones).
pub const NODE_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long a new cluster CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Sets `params` valid from a day ago (clocks differ) for `valid_for`.
fn valid_for(params: &mut CertificateParams, valid_for: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::try_from(valid_for).unwrap_or(time::Duration::days(365));
}

/// The cluster's certificate authority.
#[derive(Debug)]
pub struct ClusterCa {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl ClusterCa {
    /// A new CA with a fresh key.
    pub fn generate() -> Result<Self, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, "Eddy cluster CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        valid_for(&mut params, CA_VALIDITY);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key)?;
        Ok(Self { cert_pem: cert.pem(), issuer: Issuer::new(params, key) })
    }

    /// Writes `ca.pem` and `ca.key` (mode 0600) into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        write(&dir.join("ca.pem"), &self.cert_pem, false)?;
        write(&dir.join("ca.key"), &self.issuer.key().serialize_pem(), true)
    }

    /// Reads the CA from `dir` (`ca.pem`, `ca.key`): one made by [`ClusterCa::save`] or your
    /// own.
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
        let cert_pem = read(&cert_path)?;
        let key = KeyPair::from_pem(&read(&key_path)?).map_err(|e| invalid(&key_path, e))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|e| invalid(&cert_path, e))?;
        Ok(Self { cert_pem, issuer })
    }

    /// Reads the CA from `dir`, or makes one there first.
    pub fn load_or_create(dir: &Path) -> Result<Self, TlsError> {
        if dir.join("ca.key").exists() {
            return Self::load(dir);
        }
        let ca = Self::generate()?;
        ca.save(dir)?;
        Ok(ca)
    }

    /// A certificate for node `name`, signed by this CA, valid for [`NODE_VALIDITY`].
    pub fn issue(&self, name: &str) -> Result<NodeIdentity, TlsError> {
        self.issue_with_aliases(name, &[], NODE_VALIDITY)
    }

    /// A certificate for node `name` that also answers to `aliases` (the DNS names peers dial
    /// it by, such as a coordinator's service name), valid for `validity`.
    pub fn issue_with_aliases(
        &self,
        name: &str,
        aliases: &[String],
        validity: Duration,
    ) -> Result<NodeIdentity, TlsError> {
        let names: Vec<String> = std::iter::once(name.to_owned()).chain(aliases.iter().cloned()).collect();
        for n in &names {
            check_name(n)?;
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        valid_for(&mut params, validity);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(NodeIdentity {
            name: name.to_owned(),
            ca_pem: self.cert_pem.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A node name must be a lowercase DNS name, since it is one in the certificate.
pub fn check_name(name: &str) -> Result<(), TlsError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.'])
        && ServerName::try_from(name).is_ok_and(|n| matches!(n, ServerName::DnsName(_)));
    if valid { Ok(()) } else { Err(TlsError::BadName(name.to_owned())) }
}

/// A worker's name: one lowercase DNS label (`worker-1`), checked once where it is chosen
/// (enrollment, `eddy worker`), so that it is the same string wherever it is compared.
pub fn check_label(name: &str) -> Result<(), TlsError> {
    check_name(name)?;
    if name.contains('.') { Err(TlsError::BadName(name.to_owned())) } else { Ok(()) }
}

/// What a node presents and trusts: its name, its certificate and key, and the cluster CA.
#[derive(Clone)]
pub struct NodeIdentity {
    /// The node's name (its certificate's DNS name).
    pub name: String,
    /// The cluster CA's certificate.
    pub ca_pem: String,
    /// The node's certificate.
    pub cert_pem: String,
    /// The node's private key.
    pub key_pem: String,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIdentity").field("name", &self.name).finish_non_exhaustive()
    }
}

impl NodeIdentity {
    /// Writes `ca.pem`, `cert.pem` and `key.pem` (mode 0600) into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        write(&dir.join("ca.pem"), &self.ca_pem, false)?;
        write(&dir.join("cert.pem"), &self.cert_pem, false)?;
        write(&dir.join("key.pem"), &self.key_pem, true)
    }

    /// Reads a node's files from `dir`; the name is read from the certificate's first DNS
    /// name unless `name` is given, and must then be one of the certificate's names.
    pub fn load(dir: &Path, name: Option<&str>) -> Result<Self, TlsError> {
        let cert_path = dir.join("cert.pem");
        let identity = Self {
            name: String::new(),
            ca_pem: read(&dir.join("ca.pem"))?,
            cert_pem: read(&cert_path)?,
            key_pem: read(&dir.join("key.pem"))?,
        };
        let cert = identity.chain()?.into_iter().next().ok_or_else(|| invalid(&cert_path, "no certificate"))?;
        let name = match name {
            Some(name) => {
                verify_name(&cert, name).map_err(|e| invalid(&cert_path, e))?;
                name.to_owned()
            }
            None => first_dns_name(&identity.cert_pem).map_err(|e| invalid(&cert_path, e))?,
        };
        Ok(Self { name, ..identity })
    }

    /// When the node's certificate stops being accepted.
    pub fn expires_at(&self) -> Result<SystemTime, TlsError> {
        let cert = self.chain()?.into_iter().next().ok_or_else(|| invalid(Path::new("cert.pem"), "no certificate"))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert).map_err(|e| invalid(Path::new("cert.pem"), e))?;
        let seconds = parsed.validity().not_after.timestamp();
        Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
    }

    fn chain(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(Path::new("cert.pem"), e))
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| invalid(Path::new("key.pem"), e))
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| invalid(Path::new("ca.pem"), e))?;
            roots.add(cert)?;
        }
        if roots.is_empty() {
            return Err(invalid(Path::new("ca.pem"), "no CA certificate"));
        }
        Ok(Arc::new(roots))
    }

    /// The acceptor's side: presents this node's certificate and requires a client
    /// certificate signed by the cluster CA.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots()?, provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain()?, self.key()?)?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }

    /// The dialer's side: presents this node's certificate and trusts only the cluster CA.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.chain()?, self.key()?)?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }
}

/// Checks that `cert` (already verified to chain to the CA) names `name`.
pub(crate) fn verify_name(cert: &CertificateDer<'_>, name: &str) -> Result<(), String> {
    let server_name = ServerName::try_from(name).map_err(|e| format!("`{name}`: {e}"))?;
    let cert = webpki::EndEntityCert::try_from(cert).map_err(|e| format!("unreadable certificate: {e:?}"))?;
    cert.verify_is_valid_for_subject_name(&server_name).map_err(|_| format!("the certificate does not name `{name}`"))
}

fn first_dns_name(cert_pem: &str) -> Result<String, String> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| e.to_string())?;
    node_name(&der).ok_or_else(|| "the certificate has no DNS name".to_owned())
}

/// The node a certificate names: its first DNS subject alternative name.
pub(crate) fn node_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        // Names match without regard to case, so one form is compared everywhere.
        x509_parser::extensions::GeneralName::DNSName(dns) => Some(dns.to_ascii_lowercase()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_saved_and_loaded_issues_certificates_that_chain_to_the_same_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = ClusterCa::generate().expect("ca");
        ca.save(dir.path()).expect("save");
        let again = ClusterCa::load(dir.path()).expect("load");
        let node = again.issue("worker-1").expect("issue");
        node.save(&dir.path().join("worker-1")).expect("save node");
        let loaded = NodeIdentity::load(&dir.path().join("worker-1"), None).expect("load node");
        assert_eq!(loaded.name, "worker-1");
        assert_eq!(loaded.ca_pem, ca.cert_pem);
        assert!(loaded.server_config().is_ok() && loaded.client_config().is_ok());
        let err = NodeIdentity::load(&dir.path().join("worker-1"), Some("worker-2")).expect_err("wrong name");
        assert!(err.to_string().contains("does not name `worker-2`"), "{err}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("ca.key")).expect("stat").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn names_that_cannot_be_dns_names_are_refused() {
        let ca = ClusterCa::generate().expect("ca");
        for bad in ["", "a b", "-w", "w-", "x/y", "é", &"a".repeat(64), "COORDINATOR", "Localhost", "Worker-1"] {
            assert!(matches!(ca.issue(bad), Err(TlsError::BadName(_))), "{bad:?}");
        }
        assert!(ca.issue("worker-7.eddy.svc").is_ok());
        assert!(check_label("worker-7").is_ok());
        assert!(matches!(check_label("worker-7.eddy.svc"), Err(TlsError::BadName(_))));
    }

    #[test]
    fn certificates_expire_after_their_validity() {
        let ca = ClusterCa::generate().expect("ca");
        let node = ca.issue_with_aliases("worker-1", &[], Duration::from_secs(30 * 86_400)).expect("issue");
        let left = node.expires_at().expect("expiry").duration_since(SystemTime::now()).expect("in the future");
        assert!((29 * 86_400..=30 * 86_400).contains(&left.as_secs()), "{left:?}");
    }
}
