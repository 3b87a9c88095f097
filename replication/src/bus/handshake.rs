//! The replica-plane handshake as a sans-IO state machine (docs/protocol.md,
//! "Handshake"): frames in, frames out and a verdict. The bus drives it over TCP or TLS;
//! tests and fuzzers drive it directly.
//!
//! Acceptor check order: command is ReplicaHello (else UnknownCommand); cluster matches
//! (else ClusterMismatch); dialer id < replica_count and < own id (else DirectionalRule);
//! then, with auth: non-zero nonce_d (else AuthRequired), challenge, finish, MAC (else
//! MacMismatch). Statuses 1-3 are answered in a ReplicaChallenge before closing; 4 and 5
//! are log-only and never sent. Without auth the acceptor answers nothing on success.

use super::auth::{fresh_nonce, Bytes32, ChannelBinding, Direction, Keys, NonceError, Transcript};
use crate::wire::registry::HandshakeStatus;
use crate::wire::{
    decode, replica_plane_admit, Command, Frame, FrameError, Header, Limits, Message,
    ReplicaChallengeHeader, ReplicaFinishHeader, ReplicaHelloHeader,
};

/// This node as the handshake sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    /// blake3(cluster name), see `wire::cluster_id`.
    pub cluster: u128,
    /// This node's replica_id.
    pub replica: u8,
    /// Nodes in the roster; dialer ids must be below it.
    pub replica_count: u8,
}

/// Why a handshake failed; `reason()` is the rejection counter's label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    /// A handshake frame failed frame validation.
    Frame(FrameError),
    /// Acceptor: the first frame is not ReplicaHello (status 1).
    UnknownCommand { command: u8 },
    /// The peer names another cluster (status 2).
    ClusterMismatch { cluster: u128 },
    /// Acceptor: the dialer's id is not below ours or not in the roster (status 3).
    DirectionalRule { dialer: u8 },
    /// Acceptor: auth is enabled and the hello is unauthenticated (status 4, log-only).
    AuthRequired,
    /// A MAC failed under both the current and previous secret (status 5, log-only).
    MacMismatch,
    /// A handshake frame arrived out of order.
    UnexpectedCommand { expected: Command, found: u8 },
    /// Dialer: the acceptor refused us with this status.
    Refused { status: HandshakeStatus },
    /// Dialer: a status byte no version of the protocol defines; treated as a refusal.
    StatusUnknown { status: u8 },
    /// Dialer: the challenge names another replica than the one we dialed.
    WrongPeer { expected: u8, found: u8 },
    /// Dialer: an authenticated challenge carries an all-zero nonce_a.
    NonceZero,
    /// The system random source failed.
    Random(NonceError),
}

impl HandshakeError {
    /// Label for the rejection counters.
    pub fn reason(&self) -> &'static str {
        match self {
            HandshakeError::Frame(error) => error.reason(),
            HandshakeError::UnknownCommand { .. } => "handshake_unknown_command",
            HandshakeError::ClusterMismatch { .. } => "handshake_cluster_mismatch",
            HandshakeError::DirectionalRule { .. } => "handshake_directional_rule",
            HandshakeError::AuthRequired => "handshake_auth_required",
            HandshakeError::MacMismatch => "handshake_mac_mismatch",
            HandshakeError::UnexpectedCommand { .. } => "handshake_unexpected_command",
            HandshakeError::Refused { .. } => "handshake_refused_by_peer",
            HandshakeError::StatusUnknown { .. } => "handshake_status_unknown",
            HandshakeError::WrongPeer { .. } => "handshake_wrong_peer",
            HandshakeError::NonceZero => "handshake_nonce_zero",
            HandshakeError::Random(_) => "handshake_random_failed",
        }
    }

    /// The status byte the acceptor answers with, for the statuses that are sent.
    fn sent_status(&self) -> Option<HandshakeStatus> {
        match self {
            HandshakeError::UnknownCommand { .. } => Some(HandshakeStatus::UnknownCommand),
            HandshakeError::ClusterMismatch { .. } => Some(HandshakeStatus::ClusterMismatch),
            HandshakeError::DirectionalRule { .. } => Some(HandshakeStatus::DirectionalRule),
            _ => None,
        }
    }
}

impl core::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use HandshakeError as E;
        match self {
            E::Frame(error) => write!(f, "handshake frame: {error}"),
            E::UnknownCommand { command } => {
                write!(f, "first frame is command {command}, not ReplicaHello")
            }
            E::ClusterMismatch { cluster } => {
                write!(f, "peer belongs to cluster {cluster:#034x}")
            }
            E::DirectionalRule { dialer } => write!(
                f,
                "replica {dialer} may not dial us (only lower ids in the roster dial)"
            ),
            E::AuthRequired => write!(f, "unauthenticated hello while cluster.auth is enabled"),
            E::MacMismatch => write!(
                f,
                "handshake MAC does not verify under any configured secret"
            ),
            E::UnexpectedCommand { expected, found } => {
                write!(f, "expected {} but got command {found}", expected.name())
            }
            E::Refused { status } => write!(f, "peer refused the handshake: {status:?}"),
            E::StatusUnknown { status } => write!(f, "peer answered unknown status {status}"),
            E::WrongPeer { expected, found } => {
                write!(f, "dialed replica {expected} but replica {found} answered")
            }
            E::NonceZero => write!(f, "authenticated challenge with an all-zero nonce_a"),
            E::Random(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for HandshakeError {}

/// A failed handshake: why, and the status frame to send before closing (statuses 1-3).
#[derive(Debug)]
pub struct Refusal {
    /// Why, for the counters and the log.
    pub error: HandshakeError,
    /// A status-only ReplicaChallenge (statuses 1-3), sent best-effort before closing.
    pub reply: Option<Frame>,
}

const HANDSHAKE_LIMITS: Limits = Limits {
    max_message_size: crate::wire::HEADER_SIZE as u32,
};

fn header_for<H: Header>(local: &Local) -> H {
    let mut header = H::new();
    header.frame_mut().cluster = local.cluster;
    header.frame_mut().replica = local.replica;
    header
}

fn challenge(local: &Local, status: HandshakeStatus, nonce_a: Bytes32, mac_a: Bytes32) -> Frame {
    let mut header: ReplicaChallengeHeader = header_for(local);
    header.nonce_a = nonce_a;
    header.mac_a = mac_a;
    header.status = status as u8;
    Frame::build(&header, &[])
}

/// A status-only challenge for a refusal that happened before the handshake machine saw
/// a frame (e.g. the first header failed framing checks).
pub fn refusal_frame(local: &Local, status: HandshakeStatus) -> Frame {
    challenge(local, status, [0; 32], [0; 32])
}

fn frame_error(error: FrameError) -> HandshakeError {
    HandshakeError::Frame(error)
}

#[derive(Debug)]
enum AcceptorState {
    AwaitHello,
    AwaitFinish { transcript: Transcript },
    Done,
}

/// The accepting side of one inbound connection.
#[derive(Debug)]
pub struct Acceptor {
    local: Local,
    keys: Option<Keys>,
    binding: ChannelBinding,
    state: AcceptorState,
    dialer: Option<u8>,
}

/// What the acceptor does after a frame.
#[derive(Debug)]
pub enum AcceptorStep {
    /// Send this ReplicaChallenge and wait for ReplicaFinish.
    Challenge(Frame),
    /// The connection now carries consensus traffic from this replica.
    Established { peer: u8 },
}

impl Acceptor {
    /// `keys` is Some exactly when cluster.auth.enabled.
    pub fn new(local: Local, keys: Option<Keys>, binding: ChannelBinding) -> Acceptor {
        Acceptor {
            local,
            keys,
            binding,
            state: AcceptorState::AwaitHello,
            dialer: None,
        }
    }

    /// The dialer's id once its hello passed the directional rule.
    pub fn dialer(&self) -> Option<u8> {
        self.dialer
    }

    /// Feeds one whole frame (16-byte aligned).
    pub fn on_frame(&mut self, bytes: &[u8]) -> Result<AcceptorStep, Refusal> {
        let result = match core::mem::replace(&mut self.state, AcceptorState::Done) {
            AcceptorState::AwaitHello => self.on_hello(bytes),
            AcceptorState::AwaitFinish { transcript } => self.on_finish(bytes, &transcript),
            AcceptorState::Done => Err(HandshakeError::UnexpectedCommand {
                expected: Command::ReplicaFinish,
                found: bytes.get(60).copied().unwrap_or(0),
            }),
        };
        result.map_err(|error| Refusal {
            reply: error
                .sent_status()
                .map(|status| refusal_frame(&self.local, status)),
            error,
        })
    }

    fn on_hello(&mut self, bytes: &[u8]) -> Result<AcceptorStep, HandshakeError> {
        let command = bytes.get(60).copied().unwrap_or(0);
        if replica_plane_admit(true, command).is_err() {
            return Err(HandshakeError::UnknownCommand { command });
        }
        let hello = match decode(bytes, &HANDSHAKE_LIMITS).map_err(frame_error)? {
            Message::ReplicaHello(hello) => hello,
            other => {
                return Err(HandshakeError::UnknownCommand {
                    command: other.command() as u8,
                })
            }
        };
        if hello.frame.cluster != self.local.cluster {
            return Err(HandshakeError::ClusterMismatch {
                cluster: hello.frame.cluster,
            });
        }
        let dialer = hello.frame.replica;
        if dialer >= self.local.replica_count || dialer >= self.local.replica {
            return Err(HandshakeError::DirectionalRule { dialer });
        }
        self.dialer = Some(dialer);
        let Some(keys) = &self.keys else {
            return Ok(AcceptorStep::Established { peer: dialer });
        };
        if hello.nonce_d == [0; 32] {
            return Err(HandshakeError::AuthRequired);
        }
        let transcript = Transcript {
            cluster: self.local.cluster,
            dialer,
            acceptor: self.local.replica,
            nonce_d: hello.nonce_d,
            nonce_a: fresh_nonce().map_err(HandshakeError::Random)?,
            binding: self.binding,
        };
        let mac_a = keys.mac(&transcript, Direction::Acceptor);
        self.state = AcceptorState::AwaitFinish { transcript };
        Ok(AcceptorStep::Challenge(challenge(
            &self.local,
            HandshakeStatus::Ok,
            transcript.nonce_a,
            mac_a,
        )))
    }

    fn on_finish(
        &mut self,
        bytes: &[u8],
        transcript: &Transcript,
    ) -> Result<AcceptorStep, HandshakeError> {
        let finish = match decode(bytes, &HANDSHAKE_LIMITS).map_err(frame_error)? {
            Message::ReplicaFinish(finish) => finish,
            other => {
                return Err(HandshakeError::UnexpectedCommand {
                    expected: Command::ReplicaFinish,
                    found: other.command() as u8,
                })
            }
        };
        if finish.frame.cluster != self.local.cluster {
            return Err(HandshakeError::ClusterMismatch {
                cluster: finish.frame.cluster,
            });
        }
        let keys = self.keys.as_ref().ok_or(HandshakeError::AuthRequired)?;
        match keys.verify(transcript, Direction::Dialer, &finish.mac_d) {
            Some(_) => Ok(AcceptorStep::Established {
                peer: transcript.dialer,
            }),
            None => Err(HandshakeError::MacMismatch),
        }
    }
}

/// The dialing side of one outbound connection.
#[derive(Debug)]
pub struct Dialer {
    local: Local,
    keys: Option<Keys>,
    binding: ChannelBinding,
    peer: u8,
    nonce_d: Bytes32,
    established: bool,
}

impl Dialer {
    /// Starts a handshake with `peer`; returns the ReplicaHello to send first. Without
    /// auth the hello carries a zero nonce and the dialer is established at once.
    pub fn new(
        local: Local,
        keys: Option<Keys>,
        binding: ChannelBinding,
        peer: u8,
    ) -> Result<(Dialer, Frame), HandshakeError> {
        let nonce_d = match keys {
            Some(_) => fresh_nonce().map_err(HandshakeError::Random)?,
            None => [0; 32],
        };
        let mut hello: ReplicaHelloHeader = header_for(&local);
        hello.nonce_d = nonce_d;
        let dialer = Dialer {
            established: keys.is_none(),
            local,
            keys,
            binding,
            peer,
            nonce_d,
        };
        Ok((dialer, Frame::build(&hello, &[])))
    }

    /// Whether consensus traffic may flow.
    pub fn is_established(&self) -> bool {
        self.established
    }

    /// Feeds the acceptor's ReplicaChallenge; returns the ReplicaFinish to send, after
    /// which the connection is established.
    pub fn on_frame(&mut self, bytes: &[u8]) -> Result<Frame, HandshakeError> {
        if self.established {
            return Err(HandshakeError::UnexpectedCommand {
                expected: Command::ReplicaChallenge,
                found: bytes.get(60).copied().unwrap_or(0),
            });
        }
        let header = parse_challenge(bytes, &self.local, self.peer)?;
        let keys = self.keys.as_ref().ok_or(HandshakeError::AuthRequired)?;
        if header.nonce_a == [0; 32] {
            return Err(HandshakeError::NonceZero);
        }
        let transcript = Transcript {
            cluster: self.local.cluster,
            dialer: self.local.replica,
            acceptor: self.peer,
            nonce_d: self.nonce_d,
            nonce_a: header.nonce_a,
            binding: self.binding,
        };
        if keys
            .verify(&transcript, Direction::Acceptor, &header.mac_a)
            .is_none()
        {
            return Err(HandshakeError::MacMismatch);
        }
        let mut finish: ReplicaFinishHeader = header_for(&self.local);
        finish.mac_d = keys.mac(&transcript, Direction::Dialer);
        self.established = true;
        Ok(Frame::build(&finish, &[]))
    }
}

/// Validates a ReplicaChallenge from `peer`: command, cluster, sender and status. A
/// status byte other than Ok, known or not, is a refusal.
fn parse_challenge(
    bytes: &[u8],
    local: &Local,
    peer: u8,
) -> Result<ReplicaChallengeHeader, HandshakeError> {
    let header = match decode(bytes, &HANDSHAKE_LIMITS).map_err(frame_error)? {
        Message::ReplicaChallenge(header) => *header,
        other => {
            return Err(HandshakeError::UnexpectedCommand {
                expected: Command::ReplicaChallenge,
                found: other.command() as u8,
            })
        }
    };
    match HandshakeStatus::from_u8(header.status) {
        Some(HandshakeStatus::Ok) => {}
        Some(status) => return Err(HandshakeError::Refused { status }),
        None => {
            return Err(HandshakeError::StatusUnknown {
                status: header.status,
            })
        }
    }
    if header.frame.cluster != local.cluster {
        return Err(HandshakeError::ClusterMismatch {
            cluster: header.frame.cluster,
        });
    }
    if header.frame.replica != peer {
        return Err(HandshakeError::WrongPeer {
            expected: peer,
            found: header.frame.replica,
        });
    }
    Ok(header)
}

/// After an unauthenticated dialer is established, the acceptor may still refuse it with
/// a status-only ReplicaChallenge; any other handshake frame is out of order. Returns the
/// error for a handshake command, Ok for consensus traffic.
pub fn check_established_frame(
    bytes: &[u8],
    local: &Local,
    peer: u8,
) -> Result<(), HandshakeError> {
    let command = bytes.get(60).copied().unwrap_or(0);
    if command == Command::ReplicaChallenge as u8 {
        return match parse_challenge(bytes, local, peer) {
            Ok(_) => Err(HandshakeError::UnexpectedCommand {
                expected: Command::Commit,
                found: command,
            }),
            Err(error) => Err(error),
        };
    }
    if command == Command::ReplicaHello as u8 || command == Command::ReplicaFinish as u8 {
        return Err(HandshakeError::UnexpectedCommand {
            expected: Command::Commit,
            found: command,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::{FromZeros, IntoBytes};

    const SECRET: &[u8] = b"cluster secret of at least thirty-two bytes";
    const OTHER: &[u8] = b"a different secret, still thirty-two bytes";

    fn local(replica: u8) -> Local {
        Local {
            cluster: crate::wire::cluster_id("test"),
            replica,
            replica_count: 3,
        }
    }

    fn keys(secret: &[u8]) -> Option<Keys> {
        Some(Keys::new(secret, None).unwrap())
    }

    fn run(
        dialer_keys: Option<Keys>,
        acceptor_keys: Option<Keys>,
        binding_d: ChannelBinding,
        binding_a: ChannelBinding,
    ) -> (Result<u8, HandshakeError>, Result<(), HandshakeError>) {
        let (mut dialer, hello) = Dialer::new(local(0), dialer_keys, binding_d, 1).unwrap();
        let mut acceptor = Acceptor::new(local(1), acceptor_keys, binding_a);
        let challenge = match acceptor.on_frame(hello.as_bytes()) {
            Ok(AcceptorStep::Established { peer }) => return (Ok(peer), Ok(())),
            Ok(AcceptorStep::Challenge(frame)) => frame,
            Err(refusal) => return (Err(refusal.error), Ok(())),
        };
        let finish = match dialer.on_frame(challenge.as_bytes()) {
            Ok(frame) => frame,
            Err(error) => return (Ok(u8::MAX), Err(error)),
        };
        match acceptor.on_frame(finish.as_bytes()) {
            Ok(AcceptorStep::Established { peer }) => (Ok(peer), Ok(())),
            Ok(AcceptorStep::Challenge(_)) => panic!("second challenge"),
            Err(refusal) => (Err(refusal.error), Ok(())),
        }
    }

    #[test]
    fn authenticated_handshake_completes_in_three_frames() {
        let (acceptor, dialer) = run(
            keys(SECRET),
            keys(SECRET),
            ChannelBinding::Plaintext,
            ChannelBinding::Plaintext,
        );
        assert_eq!(acceptor, Ok(0));
        assert_eq!(dialer, Ok(()));
    }

    #[test]
    fn unauthenticated_hello_is_established_without_an_answer() {
        let (mut dialer, hello) =
            Dialer::new(local(0), None, ChannelBinding::Plaintext, 2).unwrap();
        assert!(dialer.is_established());
        let mut acceptor = Acceptor::new(local(2), None, ChannelBinding::Plaintext);
        assert!(matches!(
            acceptor.on_frame(hello.as_bytes()),
            Ok(AcceptorStep::Established { peer: 0 })
        ));
        assert!(dialer.on_frame(hello.as_bytes()).is_err());
    }

    #[test]
    fn acceptor_with_auth_refuses_an_unauthenticated_hello_silently() {
        let (_, hello) = Dialer::new(local(0), None, ChannelBinding::Plaintext, 1).unwrap();
        let mut acceptor = Acceptor::new(local(1), keys(SECRET), ChannelBinding::Plaintext);
        let refusal = acceptor.on_frame(hello.as_bytes()).unwrap_err();
        assert_eq!(refusal.error, HandshakeError::AuthRequired);
        assert!(refusal.reply.is_none(), "status 4 is log-only");
    }

    #[test]
    fn different_secrets_fail_at_the_dialer() {
        let (_, dialer) = run(
            keys(SECRET),
            keys(OTHER),
            ChannelBinding::Plaintext,
            ChannelBinding::Plaintext,
        );
        assert_eq!(dialer, Err(HandshakeError::MacMismatch));
    }

    #[test]
    fn different_channel_bindings_fail() {
        let (_, dialer) = run(
            keys(SECRET),
            keys(SECRET),
            ChannelBinding::Tls([1; 32]),
            ChannelBinding::Tls([2; 32]),
        );
        assert_eq!(dialer, Err(HandshakeError::MacMismatch));
    }

    #[test]
    fn acceptor_checks_command_then_cluster_then_direction() {
        let mut acceptor = Acceptor::new(local(1), None, ChannelBinding::Plaintext);
        let mut commit: crate::wire::CommitHeader = header_for(&local(0));
        commit.group = crate::wire::METADATA_GROUP;
        let refusal = acceptor
            .on_frame(Frame::build(&commit, &[]).as_bytes())
            .unwrap_err();
        assert_eq!(refusal.error, HandshakeError::UnknownCommand { command: 9 });
        let reply = refusal.reply.unwrap();
        assert_eq!(reply.as_bytes()[192], HandshakeStatus::UnknownCommand as u8);

        let mut foreign = local(0);
        foreign.cluster ^= 1;
        // Wrong cluster and wrong direction: the cluster is reported first.
        let (_, hello) = Dialer::new(
            Local {
                replica: 2,
                ..foreign
            },
            None,
            ChannelBinding::Plaintext,
            1,
        )
        .unwrap();
        let mut acceptor = Acceptor::new(local(1), None, ChannelBinding::Plaintext);
        let refusal = acceptor.on_frame(hello.as_bytes()).unwrap_err();
        assert!(matches!(
            refusal.error,
            HandshakeError::ClusterMismatch { .. }
        ));
        assert_eq!(refusal.reply.unwrap().as_bytes()[192], 2);

        for dialer in [1u8, 2, 5] {
            let (_, hello) = Dialer::new(
                Local {
                    replica: dialer,
                    ..local(0)
                },
                None,
                ChannelBinding::Plaintext,
                1,
            )
            .unwrap();
            let mut acceptor = Acceptor::new(local(1), None, ChannelBinding::Plaintext);
            let refusal = acceptor.on_frame(hello.as_bytes()).unwrap_err();
            assert_eq!(refusal.error, HandshakeError::DirectionalRule { dialer });
            assert_eq!(refusal.reply.unwrap().as_bytes()[192], 3);
        }
    }

    #[test]
    fn dialer_treats_every_non_ok_status_as_a_refusal() {
        for status in 1..=255u8 {
            let (mut dialer, _) =
                Dialer::new(local(0), keys(SECRET), ChannelBinding::Plaintext, 1).unwrap();
            let mut header: ReplicaChallengeHeader = header_for(&local(1));
            header.status = status;
            header.nonce_a = [1; 32];
            let error = dialer
                .on_frame(Frame::build(&header, &[]).as_bytes())
                .unwrap_err();
            assert!(
                matches!(
                    error,
                    HandshakeError::Refused { .. } | HandshakeError::StatusUnknown { .. }
                ),
                "status {status}: {error:?}"
            );
            assert!(!dialer.is_established());
        }
    }

    #[test]
    fn acceptor_mac_replayed_as_finish_is_refused() {
        let (_, hello) = Dialer::new(local(0), keys(SECRET), ChannelBinding::Plaintext, 1).unwrap();
        let mut acceptor = Acceptor::new(local(1), keys(SECRET), ChannelBinding::Plaintext);
        let Ok(AcceptorStep::Challenge(challenge)) = acceptor.on_frame(hello.as_bytes()) else {
            panic!("expected a challenge");
        };
        let mut finish: ReplicaFinishHeader = header_for(&local(0));
        finish
            .mac_d
            .copy_from_slice(&challenge.as_bytes()[160..192]);
        let refusal = acceptor
            .on_frame(Frame::build(&finish, &[]).as_bytes())
            .unwrap_err();
        assert_eq!(refusal.error, HandshakeError::MacMismatch);
    }

    #[test]
    fn arbitrary_first_frames_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2_000 {
            let mut header = crate::wire::GenericHeader::new_zeroed();
            let bytes = header.as_mut_bytes();
            for byte in bytes.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *byte = seed as u8;
            }
            bytes[48..52].copy_from_slice(&256u32.to_le_bytes());
            bytes[60] = (seed % 32) as u8;
            let frame = crate::wire::FrameBuf::from_bytes(bytes);
            let mut acceptor = Acceptor::new(local(2), keys(SECRET), ChannelBinding::Plaintext);
            let _ = acceptor.on_frame(frame.as_bytes());
            let (mut dialer, _) =
                Dialer::new(local(0), keys(SECRET), ChannelBinding::Plaintext, 1).unwrap();
            assert!(dialer.on_frame(frame.as_bytes()).is_err());
        }
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    fn local(replica: u8) -> Local {
        Local {
            cluster: crate::wire::cluster_id("prop"),
            replica,
            replica_count: 5,
        }
    }

    fn frame_from(mut bytes: Vec<u8>, command: u8, plausible: bool) -> crate::wire::FrameBuf {
        bytes.resize(256, 0);
        bytes[60] = command;
        if plausible {
            // Size, release and cluster right: only the command area is random.
            bytes[48..52].copy_from_slice(&256u32.to_le_bytes());
            bytes[56..60].fill(0);
            bytes[32..48].copy_from_slice(&local(0).cluster.to_le_bytes());
            bytes[61] %= 5;
        }
        crate::wire::FrameBuf::from_bytes(&bytes)
    }

    proptest! {
        #[test]
        fn acceptor_and_dialer_never_panic_and_never_establish_on_forged_frames(
            frames in proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 256), 12u8..18, any::<bool>()),
                1..4,
            ),
            auth in any::<bool>(),
        ) {
            let keys = auth.then(|| Keys::new(&[7; 32], None).unwrap());
            let mut acceptor = Acceptor::new(local(3), keys.clone(), ChannelBinding::Plaintext);
            let (mut dialer, _) =
                Dialer::new(local(0), Some(Keys::new(&[7; 32], None).unwrap()), ChannelBinding::Plaintext, 1)
                    .unwrap();
            for (bytes, command, plausible) in frames {
                let frame = frame_from(bytes, command, plausible);
                match acceptor.on_frame(frame.as_bytes()) {
                    // Random bytes can form a valid hello only with auth off (with auth,
                    // the finish MAC cannot be forged).
                    Ok(AcceptorStep::Established { peer }) => {
                        prop_assert!(!auth);
                        prop_assert!(peer < 3);
                    }
                    Ok(AcceptorStep::Challenge(_)) => prop_assert!(auth),
                    Err(_) => {}
                }
                prop_assert!(dialer.on_frame(frame.as_bytes()).is_err());
            }
        }
    }
}
