//! Password hashing for users: salted Argon2id in PHC strings. Only the primary hashes
//! (salts are random), and only hashes are replicated.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// A password must be at least this long.
pub const PASSWORD_LEN_MIN: usize = 8;

/// Why a password could not be hashed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordError {
    TooShort { len: usize },
    Hash(String),
}

impl core::fmt::Display for PasswordError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PasswordError::TooShort { len } => write!(
                f,
                "password of {len} bytes is shorter than {PASSWORD_LEN_MIN}"
            ),
            PasswordError::Hash(e) => write!(f, "password hashing failed: {e}"),
        }
    }
}

impl std::error::Error for PasswordError {}

/// Hashes a password with a fresh random salt.
pub fn hash_password(password: &[u8]) -> Result<String, PasswordError> {
    if password.len() < PASSWORD_LEN_MIN {
        return Err(PasswordError::TooShort {
            len: password.len(),
        });
    }
    hash_operator_password(password)
}

/// Hashes a password an operator chose for the root user at format: any length but
/// empty (a client's CreateUser and ChangePassword keep `PASSWORD_LEN_MIN`).
pub fn hash_operator_password(password: &[u8]) -> Result<String, PasswordError> {
    if password.is_empty() {
        return Err(PasswordError::TooShort { len: 0 });
    }
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password, &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
}

/// Checks a password against a stored hash; a malformed hash never verifies.
/// A new personal access token: 32 random bytes as 64 hex digits, and its hash.
pub fn new_token() -> (String, String) {
    use argon2::password_hash::rand_core::RngCore;
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let hash = token_hash(token.as_bytes());
    (token, hash)
}

/// The hash a token is kept and looked up by: BLAKE3, hex. A token is 256 random bits,
/// so a fast hash is enough (a password needs a slow, salted one).
pub fn token_hash(token: &[u8]) -> String {
    blake3::hash(token).to_hex().to_string()
}

pub fn verify_password(password: &[u8], hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|parsed| Argon2::default().verify_password(password, &parsed).is_ok())
        .unwrap_or(false)
}

/// A hash of a password no one knows, verified against for unknown user names so a
/// failed login takes the same time whether or not the user exists.
pub fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password(b"decoy password for unknown users").unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_verifies_against_its_salted_hash_only() {
        let hash = hash_password(b"correct horse").unwrap();
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password(b"correct horse", &hash));
        assert!(!verify_password(b"correct horsf", &hash));
        assert_ne!(
            hash,
            hash_password(b"correct horse").unwrap(),
            "salts differ"
        );
        assert!(!verify_password(b"x", "not a hash"));
        assert_eq!(
            hash_password(b"short"),
            Err(PasswordError::TooShort { len: 5 })
        );
    }

    #[test]
    fn an_operators_root_password_may_be_short_but_not_empty() {
        let hash = hash_operator_password(b"iggy").unwrap();
        assert!(verify_password(b"iggy", &hash));
        assert_eq!(
            hash_operator_password(b""),
            Err(PasswordError::TooShort { len: 0 })
        );
    }
}
