//! The one certificate → principal rule.

use x509_parser::prelude::{FromDer, X509Certificate};

use crate::AuthError;

/// The principal a DER-encoded client certificate names: the first Common Name of its subject,
/// or the whole subject (RFC 4514 form, as in `O=Example, OU=Workers`) when it has none.
///
/// The certificate is not verified here; the TLS handshake has already done that.
pub fn certificate_principal(der: &[u8]) -> Result<String, AuthError> {
    let (_, certificate) = X509Certificate::from_der(der)
        .map_err(|error| AuthError::UnreadableCertificate(error.to_string()))?;
    let subject = certificate.subject();
    match subject.iter_common_name().next() {
        Some(common_name) => common_name
            .as_str()
            .map(str::to_owned)
            .map_err(|error| AuthError::UnreadableCertificate(error.to_string())),
        None => Ok(subject.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(names: &[(rcgen::DnType, &str)]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in names {
            params.distinguished_name.push(kind.clone(), *value);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn common_name_is_the_principal() {
        let der = certificate(&[
            (rcgen::DnType::OrganizationName, "Example"),
            (rcgen::DnType::CommonName, "worker-7"),
        ]);
        assert_eq!(certificate_principal(&der).unwrap(), "worker-7");
    }

    #[test]
    fn subject_without_common_name_is_used_whole() {
        let der = certificate(&[(rcgen::DnType::OrganizationName, "Example")]);
        assert_eq!(certificate_principal(&der).unwrap(), "O=Example");
    }

    #[test]
    fn garbage_is_unreadable() {
        assert!(matches!(
            certificate_principal(b"not a certificate"),
            Err(AuthError::UnreadableCertificate(_))
        ));
    }
}
