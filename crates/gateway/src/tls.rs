//! TLS material: the configured server certificate, or development material generated once.
//!
//! Without `tls.cert`, the first start generates a development CA and a server certificate
//! for `localhost`, `127.0.0.1` and `::1` signed by it, under `<data_dir>/tls/`; later starts
//! reuse them, so workers that trust `ca.pem` keep trusting the gateway. Keys are written
//! readable by the owner only. The four files are generated only together: when some exist
//! and others are missing the start is refused naming the missing ones, rather than replacing
//! a CA that workers may trust.
//!
//! Every error names the configuration key whose file is at fault (`tls.key: /path: ...`).

use std::io::Write;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsSection;

/// Why TLS material could not be loaded or generated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{key}: {}: {source}", path.display())]
    Io {
        /// The configuration key naming the file (`tls.data_dir` for development material).
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A PEM file holds nothing usable.
    #[error("{key}: {}: {problem}", path.display())]
    Pem {
        /// The configuration key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// Some development files exist and others do not; none is replaced.
    #[error("tls.data_dir: development TLS material in {} is incomplete: {} missing while {} \
        exist; workers may trust the existing CA, so nothing is regenerated. Restore the \
        missing files, or remove all four to generate a new CA",
        dir.display(), missing.join(", "), present.join(", "))]
    Incomplete {
        /// The directory.
        dir: PathBuf,
        /// The files that are missing.
        missing: Vec<String>,
        /// The files that exist.
        present: Vec<String>,
    },
    /// Generating development material failed.
    #[error("generating development certificates: {0}")]
    Generate(#[from] rcgen::Error),
}

/// The server's certificate chain and key, and the CA client certificates must chain to.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    cert_key: &'static str,
    key_key: &'static str,
    cert_path: PathBuf,
    key_path: PathBuf,
    dev_ca_path: Option<PathBuf>,
    client_ca_path: Option<PathBuf>,
    cert_pem: String,
    key_pem: String,
    client_ca_pem: Option<String>,
    client_cert_required: bool,
    generated: bool,
}

/// File names of the development material inside `<data_dir>/tls/`.
const DEV_FILES: [&str; 4] = ["ca.pem", "ca-key.pem", "server.pem", "server-key.pem"];

/// The key development material is found under.
const DATA_DIR_KEY: &str = "tls.data_dir";
/// The key of the client CA bundle.
const CLIENT_CA_KEY: &str = "tls.client_ca";

impl TlsMaterial {
    /// Loads the configured material, or the development material under `data_dir` (generated
    /// on first use).
    pub fn load(section: &TlsSection, data_dir: &Path) -> Result<Self, TlsError> {
        let (cert_key, key_key) = if section.cert.is_empty() {
            (DATA_DIR_KEY, DATA_DIR_KEY)
        } else {
            ("tls.cert", "tls.key")
        };
        let (cert_path, key_path, dev_ca_path, generated) = if section.cert.is_empty() {
            let dir = data_dir.join("tls");
            let generated = ensure_dev_material(&dir)?;
            (
                dir.join(DEV_FILES[2]),
                dir.join(DEV_FILES[3]),
                Some(dir.join(DEV_FILES[0])),
                generated,
            )
        } else {
            (
                PathBuf::from(&section.cert),
                PathBuf::from(&section.key),
                None,
                false,
            )
        };
        let client_ca_path =
            (!section.client_ca.is_empty()).then(|| PathBuf::from(&section.client_ca));
        let material = Self {
            cert_pem: read(cert_key, &cert_path)?,
            key_pem: read(key_key, &key_path)?,
            client_ca_pem: client_ca_path
                .as_deref()
                .map(|path| read(CLIENT_CA_KEY, path))
                .transpose()?,
            cert_key,
            key_key,
            cert_path,
            key_path,
            dev_ca_path,
            client_ca_path,
            client_cert_required: section.require_client_cert,
            generated,
        };
        // Parse once now so a bad file fails the start, not the first handshake.
        material.cert_chain()?;
        material.private_key()?;
        material.client_ca_certs()?;
        Ok(material)
    }

    /// The server certificate chain file.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The server key file.
    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    /// The development CA workers must trust, when the material is generated.
    pub fn dev_ca_path(&self) -> Option<&Path> {
        self.dev_ca_path.as_deref()
    }

    /// True when this start generated the development material.
    pub fn generated(&self) -> bool {
        self.generated
    }

    /// The server certificate chain, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The server key, PEM.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The client CA bundle, PEM, when mutual TLS is configured.
    pub fn client_ca_pem(&self) -> Option<&str> {
        self.client_ca_pem.as_deref()
    }

    /// True when the handshake refuses callers without a trusted client certificate
    /// (`tls.require_client_cert`); false lets them authenticate with a token instead.
    pub fn client_cert_required(&self) -> bool {
        self.client_cert_required && self.client_ca_pem.is_some()
    }

    /// The server certificate chain, DER.
    pub fn cert_chain(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let chain = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| pem_error(self.cert_key, &self.cert_path, error.to_string()))?;
        if chain.is_empty() {
            return Err(pem_error(
                self.cert_key,
                &self.cert_path,
                "no certificate".to_owned(),
            ));
        }
        Ok(chain)
    }

    /// The server key, DER.
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|error| pem_error(self.key_key, &self.key_path, error.to_string()))
    }

    /// The client CA certificates, DER; empty when mutual TLS is not configured.
    pub fn client_ca_certs(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let (Some(pem), Some(path)) = (&self.client_ca_pem, &self.client_ca_path) else {
            return Ok(Vec::new());
        };
        let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| pem_error(CLIENT_CA_KEY, path, error.to_string()))?;
        if certs.is_empty() {
            return Err(pem_error(CLIENT_CA_KEY, path, "no certificate".to_owned()));
        }
        Ok(certs)
    }
}

/// The data directory: `tls.data_dir` when set, else `$XDG_DATA_HOME/switchyard`, else
/// `$HOME/.local/share/switchyard`, else `.switchyard` in the working directory.
pub fn resolve_data_dir(configured: &str) -> PathBuf {
    data_dir_from(
        configured,
        std::env::var_os("XDG_DATA_HOME"),
        std::env::var_os("HOME"),
    )
}

/// [`resolve_data_dir`] with the environment's `XDG_DATA_HOME` and `HOME` given (an empty
/// value counts as unset).
fn data_dir_from(
    configured: &str,
    xdg_data_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> PathBuf {
    if !configured.is_empty() {
        return PathBuf::from(configured);
    }
    if let Some(xdg) = xdg_data_home.filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("switchyard");
    }
    if let Some(home) = home.filter(|v| !v.is_empty()) {
        return PathBuf::from(home).join(".local/share/switchyard");
    }
    PathBuf::from(".switchyard")
}

/// Generates the development CA and server certificate when none of the four files exists;
/// returns whether it generated them. Some present and some missing is refused.
fn ensure_dev_material(dir: &Path) -> Result<bool, TlsError> {
    let (present, missing): (Vec<&str>, Vec<&str>) =
        DEV_FILES.iter().partition(|name| dir.join(name).exists());
    if missing.is_empty() {
        return Ok(false);
    }
    if !present.is_empty() {
        return Err(TlsError::Incomplete {
            dir: dir.to_owned(),
            missing: missing.iter().map(|name| (*name).to_owned()).collect(),
            present: present.iter().map(|name| (*name).to_owned()).collect(),
        });
    }
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Io {
        key: DATA_DIR_KEY,
        path: dir.to_owned(),
        source,
    })?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Switchyard development CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = rcgen::KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, &ca_key);

    let mut server_params = rcgen::CertificateParams::new(vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ])?;
    server_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "switchyard gateway");
    server_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = rcgen::KeyPair::generate()?;
    let server_cert = server_params.signed_by(&server_key, &issuer)?;

    write(&dir.join(DEV_FILES[0]), &ca_cert.pem(), false)?;
    write(&dir.join(DEV_FILES[1]), &ca_key.serialize_pem(), true)?;
    write(&dir.join(DEV_FILES[2]), &server_cert.pem(), false)?;
    write(&dir.join(DEV_FILES[3]), &server_key.serialize_pem(), true)?;
    tracing::warn!(
        dir = %dir.display(),
        files = ?DEV_FILES,
        "generated new development TLS material (a new CA): workers must trust the new ca.pem"
    );
    Ok(true)
}

fn write(path: &Path, contents: &str, secret: bool) -> Result<(), TlsError> {
    let io = |source| TlsError::Io {
        key: DATA_DIR_KEY,
        path: path.to_owned(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)
}

fn read(key: &'static str, path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Io {
        key,
        path: path.to_owned(),
        source,
    })
}

fn pem_error(key: &'static str, path: &Path, problem: String) -> TlsError {
    TlsError::Pem {
        key,
        path: path.to_owned(),
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_dir_is_the_setting_else_xdg_data_home_else_home_else_the_working_directory() {
        let some = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(
            data_dir_from("/srv/sy", some("/xdg"), some("/home/u")),
            PathBuf::from("/srv/sy")
        );
        assert_eq!(
            data_dir_from("", some("/xdg"), some("/home/u")),
            PathBuf::from("/xdg/switchyard")
        );
        assert_eq!(
            data_dir_from("", some(""), some("/home/u")),
            PathBuf::from("/home/u/.local/share/switchyard"),
            "an empty XDG_DATA_HOME counts as unset"
        );
        assert_eq!(
            data_dir_from("", None, some("/home/u")),
            PathBuf::from("/home/u/.local/share/switchyard")
        );
        assert_eq!(
            data_dir_from("", None, some("")),
            PathBuf::from(".switchyard")
        );
        assert_eq!(data_dir_from("", None, None), PathBuf::from(".switchyard"));
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "switchyard-tls-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn development_material_is_generated_once_then_reused() {
        let dir = temp_dir("reuse");
        let first = TlsMaterial::load(&TlsSection::default(), &dir).unwrap();
        assert!(first.generated());
        assert_eq!(first.cert_chain().unwrap().len(), 1);
        let ca = first.dev_ca_path().unwrap().to_owned();
        assert!(ca.is_file());

        let second = TlsMaterial::load(&TlsSection::default(), &dir).unwrap();
        assert!(!second.generated());
        assert_eq!(
            second.cert_pem(),
            first.cert_pem(),
            "the certificate is reused"
        );
        assert_eq!(second.dev_ca_path(), Some(ca.as_path()));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A TLS handshake in memory between a client trusting `ca` and asking for `name`, and a
    /// server presenting `material`'s certificate.
    fn handshake(material: &TlsMaterial, ca: &[u8], name: &str) -> Result<(), rustls::Error> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca) {
            roots.add(cert.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                material.cert_chain().unwrap(),
                material.private_key().unwrap(),
            )
            .unwrap();
        let name = rustls_pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let mut client = rustls::ClientConnection::new(std::sync::Arc::new(client), name).unwrap();
        let mut server = rustls::ServerConnection::new(std::sync::Arc::new(server)).unwrap();
        // Bounded: a TLS 1.3 handshake takes two flights each way.
        for _ in 0..8 {
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
            let mut wire = Vec::new();
            client.write_tls(&mut wire).unwrap();
            server.read_tls(&mut wire.as_slice()).unwrap();
            server.process_new_packets()?;
            let mut wire = Vec::new();
            server.write_tls(&mut wire).unwrap();
            client.read_tls(&mut wire.as_slice()).unwrap();
            client.process_new_packets()?;
        }
        panic!("the handshake did not finish");
    }

    /// `docs/configuration.md`, `tls.cert`: the development certificate is for `localhost`,
    /// `127.0.0.1` and `::1`, signed by the generated `ca.pem`.
    #[test]
    fn the_development_certificate_names_localhost_and_both_loopback_addresses() {
        let dir = temp_dir("names");
        let material = TlsMaterial::load(&TlsSection::default(), &dir).unwrap();
        let ca = std::fs::read(material.dev_ca_path().unwrap()).unwrap();
        for name in ["localhost", "127.0.0.1", "::1"] {
            assert_eq!(handshake(&material, &ca, name), Ok(()), "{name}");
        }
        // Control: a name the certificate does not carry is refused.
        let other = handshake(&material, &ca, "gateway.example");
        assert!(
            matches!(other, Err(rustls::Error::InvalidCertificate(_))),
            "{other:?}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn generated_keys_are_private_to_the_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("mode");
        let material = TlsMaterial::load(&TlsSection::default(), &dir).unwrap();
        let mode = std::fs::metadata(material.key_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "key mode {mode:o}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn configured_files_are_used_and_a_bad_one_fails_naming_it() {
        let dir = temp_dir("files");
        let dev = TlsMaterial::load(&TlsSection::default(), &dir).unwrap();
        let section = TlsSection {
            cert: dev.cert_path().display().to_string(),
            key: dev.key_path().display().to_string(),
            client_ca: dev.dev_ca_path().unwrap().display().to_string(),
            ..TlsSection::default()
        };
        let loaded = TlsMaterial::load(&section, Path::new("/nonexistent")).unwrap();
        assert!(loaded.dev_ca_path().is_none());
        assert_eq!(loaded.client_ca_certs().unwrap().len(), 1);

        let bogus = dir.join("bogus.pem");
        std::fs::write(&bogus, "not pem").unwrap();
        let error = TlsMaterial::load(
            &TlsSection {
                cert: bogus.display().to_string(),
                ..section
            },
            &dir,
        )
        .unwrap_err();
        assert!(error.to_string().contains("bogus.pem"), "{error}");
        assert!(error.to_string().starts_with("tls.cert: "), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_missing_key_file_is_named_by_its_key() {
        let dir = temp_dir("missing-key");
        let dev = TlsMaterial::load(&TlsSection::default(), &dir).unwrap();
        let missing = dir.join("nowhere-key.pem");
        let error = TlsMaterial::load(
            &TlsSection {
                cert: dev.cert_path().display().to_string(),
                key: missing.display().to_string(),
                ..TlsSection::default()
            },
            &dir,
        )
        .unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("tls.key: "), "{message}");
        assert!(message.contains("nowhere-key.pem"), "{message}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_missing_development_file_is_refused_and_the_ca_kept() {
        let dir = temp_dir("partial");
        let first = TlsMaterial::load(&TlsSection::default(), &dir).unwrap();
        let ca_path = first.dev_ca_path().unwrap().to_owned();
        let ca = std::fs::read_to_string(&ca_path).unwrap();
        std::fs::remove_file(first.key_path()).unwrap();
        let error = TlsMaterial::load(&TlsSection::default(), &dir).unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("tls.data_dir: ") && message.contains("server-key.pem missing"),
            "{message}"
        );
        assert_eq!(
            std::fs::read_to_string(&ca_path).unwrap(),
            ca,
            "the CA workers trust is left as it was"
        );
        assert!(!first.key_path().exists(), "nothing was regenerated");
        // Control: with every file removed, the material is generated again, whole.
        for name in DEV_FILES {
            std::fs::remove_file(ca_path.with_file_name(name)).ok();
        }
        let again = TlsMaterial::load(&TlsSection::default(), &dir).unwrap();
        assert!(again.generated());
        assert_ne!(std::fs::read_to_string(&ca_path).unwrap(), ca);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
