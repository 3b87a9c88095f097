//! Handshake authentication (docs/protocol.md, "Handshake"): the MAC key derived
//! from cluster.auth.shared_secret, the transcript every MAC covers, and verification
//! against the current and the previous secret (the rotation window).
//!
//! A side always MACs under its current secret; the previous secret is only ever used to
//! verify a peer's MAC. A cluster rotates in three rolls: (1) shared_secret = old,
//! previous_shared_secret = new; (2) shared_secret = new, previous_shared_secret = old;
//! (3) drop previous_shared_secret. Any two nodes one roll apart still connect.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// A secret shorter than this is refused at start (docs/protocol.md, "Handshake": 32+ bytes).
pub const SECRET_LEN_MIN: usize = 32;
/// Bytes of a MAC, a nonce, a derived key and the TLS exporter value.
pub const MAC_LEN: usize = 32;
/// The TLS exporter label folded into every MAC as channel binding.
pub const EXPORTER_LABEL: &[u8] = b"iggy replica psk binding";

/// Domain string of the key derivation, so the key is never the raw secret.
const KEY_DOMAIN: &[u8] = b"iggy replica handshake key v1";
/// Fixed domain string at the start of every MAC transcript.
const MAC_DOMAIN: &[u8] = b"iggy replica handshake mac v1";

/// A 32-byte nonce, MAC or exporter value.
pub type Bytes32 = [u8; MAC_LEN];

/// Which side's MAC this is; the byte in the transcript keeps one side's MAC from being
/// replayed as the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// mac_d, in ReplicaFinish.
    Dialer = 1,
    /// mac_a, in ReplicaChallenge.
    Acceptor = 2,
}

/// The transport the handshake runs over, folded into the transcript.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelBinding {
    /// Mode byte 0, exporter bytes zero.
    Plaintext,
    /// Mode byte 1 and the TLS 1.3 exporter value of this connection.
    Tls(Bytes32),
}

impl ChannelBinding {
    fn mode(&self) -> u8 {
        match self {
            ChannelBinding::Plaintext => 0,
            ChannelBinding::Tls(_) => 1,
        }
    }

    fn exporter(&self) -> Bytes32 {
        match self {
            ChannelBinding::Plaintext => [0; MAC_LEN],
            ChannelBinding::Tls(value) => *value,
        }
    }
}

/// Everything both MACs of one handshake cover, in order (docs/protocol.md, "Handshake").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transcript {
    /// The cluster id (`wire::cluster_id`).
    pub cluster: u128,
    /// The dialing replica's id.
    pub dialer: u8,
    /// The accepting replica's id.
    pub acceptor: u8,
    /// ReplicaHello's nonce.
    pub nonce_d: Bytes32,
    /// ReplicaChallenge's nonce.
    pub nonce_a: Bytes32,
    /// Mode byte and TLS exporter value.
    pub binding: ChannelBinding,
}

/// Why a secret was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretError {
    /// The secret has fewer than 32 bytes.
    TooShort { key: &'static str, len: usize },
}

impl core::fmt::Display for SecretError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SecretError::TooShort { key, len } => write!(
                f,
                "cluster.auth.{key} has {len} bytes; at least {SECRET_LEN_MIN} are required"
            ),
        }
    }
}

impl std::error::Error for SecretError {}

/// A key derived from one secret. Never printed.
#[derive(Clone)]
pub struct Key(Bytes32);

impl core::fmt::Debug for Key {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// HMAC-SHA256(secret, domain): the secret never keys a transcript MAC directly.
    pub fn derive(secret: &[u8], key: &'static str) -> Result<Key, SecretError> {
        if secret.len() < SECRET_LEN_MIN {
            return Err(SecretError::TooShort {
                key,
                len: secret.len(),
            });
        }
        let mut mac = new_mac(secret);
        mac.update(KEY_DOMAIN);
        Ok(Key(mac.finalize().into_bytes().into()))
    }

    fn transcript_mac(&self, transcript: &Transcript, direction: Direction) -> HmacSha256 {
        let mut mac = new_mac(&self.0);
        mac.update(MAC_DOMAIN);
        mac.update(&transcript.cluster.to_le_bytes());
        mac.update(&[transcript.dialer, transcript.acceptor]);
        mac.update(&transcript.nonce_d);
        mac.update(&transcript.nonce_a);
        mac.update(&[transcript.binding.mode()]);
        mac.update(&transcript.binding.exporter());
        mac.update(&[direction as u8]);
        mac
    }

    /// The MAC of `direction` over `transcript`.
    pub fn mac(&self, transcript: &Transcript, direction: Direction) -> Bytes32 {
        self.transcript_mac(transcript, direction)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Constant-time comparison of a received MAC.
    pub fn verify(&self, transcript: &Transcript, direction: Direction, mac: &Bytes32) -> bool {
        self.transcript_mac(transcript, direction)
            .verify_slice(mac)
            .is_ok()
    }
}

fn new_mac(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; the error arm cannot occur.
    <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key"))
}

/// Which configured secret verified a peer's MAC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretUsed {
    /// shared_secret.
    Current,
    /// previous_shared_secret.
    Previous,
}

/// The keys of cluster.auth: current (MACs and verifies) and previous (verifies only).
#[derive(Clone, Debug)]
pub struct Keys {
    current: Key,
    previous: Option<Key>,
}

impl Keys {
    /// Derives both keys; a secret under 32 bytes is refused.
    pub fn new(
        shared_secret: &[u8],
        previous_shared_secret: Option<&[u8]>,
    ) -> Result<Keys, SecretError> {
        Ok(Keys {
            current: Key::derive(shared_secret, "shared_secret")?,
            previous: previous_shared_secret
                .map(|secret| Key::derive(secret, "previous_shared_secret"))
                .transpose()?,
        })
    }

    /// This side's MAC: always under the current secret.
    pub fn mac(&self, transcript: &Transcript, direction: Direction) -> Bytes32 {
        self.current.mac(transcript, direction)
    }

    /// Verifies a peer's MAC under the current secret, then the previous one.
    pub fn verify(
        &self,
        transcript: &Transcript,
        direction: Direction,
        mac: &Bytes32,
    ) -> Option<SecretUsed> {
        if self.current.verify(transcript, direction, mac) {
            return Some(SecretUsed::Current);
        }
        match &self.previous {
            Some(previous) if previous.verify(transcript, direction, mac) => {
                Some(SecretUsed::Previous)
            }
            _ => None,
        }
    }
}

/// A fresh non-zero 32-byte nonce from the operating system's CSPRNG (through rustls'
/// ring provider, so no extra dependency). All zero is reserved for "unauthenticated".
pub fn fresh_nonce() -> Result<Bytes32, NonceError> {
    let random = rustls::crypto::ring::default_provider().secure_random;
    let mut nonce = [0u8; MAC_LEN];
    for _ in 0..4 {
        random.fill(&mut nonce).map_err(|_| NonceError)?;
        if nonce != [0; MAC_LEN] {
            return Ok(nonce);
        }
    }
    Err(NonceError)
}

/// The operating system's random source failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NonceError;

impl core::fmt::Display for NonceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("the system random source failed")
    }
}

impl std::error::Error for NonceError {}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &[u8] = b"an old shared secret of 32+ bytes.....";
    const NEW: &[u8] = b"a new shared secret, also 32+ bytes long";

    fn transcript() -> Transcript {
        Transcript {
            cluster: 7,
            dialer: 0,
            acceptor: 1,
            nonce_d: [1; 32],
            nonce_a: [2; 32],
            binding: ChannelBinding::Plaintext,
        }
    }

    #[test]
    fn short_secrets_are_refused() {
        assert_eq!(
            Keys::new(&[7; 31], None).err(),
            Some(SecretError::TooShort {
                key: "shared_secret",
                len: 31
            })
        );
        assert!(Keys::new(&[7; 32], Some(&[1; 5])).is_err());
        assert!(Keys::new(&[7; 32], Some(&[1; 32])).is_ok());
    }

    #[test]
    fn each_transcript_field_changes_the_mac() {
        let keys = Keys::new(NEW, None).unwrap();
        let base = transcript();
        let mac = keys.mac(&base, Direction::Dialer);
        let variants = [
            Transcript { cluster: 8, ..base },
            Transcript { dialer: 2, ..base },
            Transcript {
                acceptor: 2,
                ..base
            },
            Transcript {
                nonce_d: [3; 32],
                ..base
            },
            Transcript {
                nonce_a: [3; 32],
                ..base
            },
            Transcript {
                binding: ChannelBinding::Tls([0; 32]),
                ..base
            },
            Transcript {
                binding: ChannelBinding::Tls([9; 32]),
                ..base
            },
        ];
        for variant in variants {
            assert_ne!(keys.mac(&variant, Direction::Dialer), mac, "{variant:?}");
            assert_eq!(keys.verify(&variant, Direction::Dialer, &mac), None);
        }
        assert_eq!(
            keys.verify(&base, Direction::Dialer, &mac),
            Some(SecretUsed::Current)
        );
    }

    #[test]
    fn a_mac_from_one_direction_does_not_verify_as_the_other() {
        let keys = Keys::new(NEW, None).unwrap();
        let mac_d = keys.mac(&transcript(), Direction::Dialer);
        assert_eq!(
            keys.verify(&transcript(), Direction::Acceptor, &mac_d),
            None
        );
    }

    #[test]
    fn previous_secret_verifies_but_never_macs() {
        let rotated = Keys::new(NEW, Some(OLD)).unwrap();
        let old = Keys::new(OLD, None).unwrap();
        let new_only = Keys::new(NEW, None).unwrap();
        let from_old = old.mac(&transcript(), Direction::Dialer);
        assert_eq!(
            rotated.verify(&transcript(), Direction::Dialer, &from_old),
            Some(SecretUsed::Previous)
        );
        assert_eq!(
            new_only.verify(&transcript(), Direction::Dialer, &from_old),
            None
        );
        assert_eq!(
            rotated.mac(&transcript(), Direction::Acceptor),
            new_only.mac(&transcript(), Direction::Acceptor)
        );
    }

    #[test]
    fn nonces_are_fresh_and_non_zero() {
        let a = fresh_nonce().unwrap();
        let b = fresh_nonce().unwrap();
        assert_ne!(a, [0; 32]);
        assert_ne!(a, b);
    }
}
