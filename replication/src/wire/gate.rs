//! Plane gates: which commands each listener admits (docs/protocol.md, "Framing").
//! The separation is structural, not marked inside frames, so it lives here once.

use super::registry::Command;

/// Why a listener refused a frame's command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateError {
    /// The client plane admits only Request (5).
    NotRequest { command: u8 },
    /// The replica plane's first frame must be ReplicaHello.
    HelloRequired { command: u8 },
    /// Client-bound or unused commands arriving on the replica plane.
    RefusedOnReplicaPlane { command: u8 },
}

impl GateError {
    /// Label for the rejection counters.
    pub fn reason(&self) -> &'static str {
        match self {
            GateError::NotRequest { .. } => "client_plane_not_request",
            GateError::HelloRequired { .. } => "replica_plane_hello_required",
            GateError::RefusedOnReplicaPlane { .. } => "replica_plane_refused_command",
        }
    }
}

impl core::fmt::Display for GateError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            GateError::NotRequest { command } => write!(
                f,
                "client plane admits only Request (5), got command {command}"
            ),
            GateError::HelloRequired { command } => write!(
                f,
                "replica plane requires ReplicaHello first, got command {command}"
            ),
            GateError::RefusedOnReplicaPlane { command } => {
                write!(f, "command {command} is refused on the replica plane")
            }
        }
    }
}

impl std::error::Error for GateError {}

/// The client listener parses every inbound frame as a Request; anything else is refused.
pub fn client_plane_admit(command: u8) -> Result<(), GateError> {
    if command == Command::Request as u8 {
        Ok(())
    } else {
        Err(GateError::NotRequest { command })
    }
}

/// The replica listener: the first frame of a connection must be ReplicaHello; Reply (8)
/// and Eviction (13) are client-bound and refused, as are the unused commands 1-4.
pub fn replica_plane_admit(first_frame: bool, command: u8) -> Result<(), GateError> {
    if first_frame {
        return if command == Command::ReplicaHello as u8 {
            Ok(())
        } else {
            Err(GateError::HelloRequired { command })
        };
    }
    match Command::from_u8(command) {
        Some(Command::Reply | Command::Eviction)
        | Some(Command::Ping | Command::Pong | Command::PingClient | Command::PongClient)
        | None => Err(GateError::RefusedOnReplicaPlane { command }),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_plane_admits_only_request() {
        for command in 0..=255u8 {
            assert_eq!(
                client_plane_admit(command).is_ok(),
                command == 5,
                "command {command}"
            );
        }
    }

    #[test]
    fn replica_plane_demands_hello_first() {
        assert!(replica_plane_admit(true, Command::ReplicaHello as u8).is_ok());
        for command in [5u8, 6, 9, 15, 16] {
            assert_eq!(
                replica_plane_admit(true, command),
                Err(GateError::HelloRequired { command })
            );
        }
    }

    #[test]
    fn replica_plane_refuses_reply_and_eviction_after_hello() {
        assert!(replica_plane_admit(false, Command::Reply as u8).is_err());
        assert!(replica_plane_admit(false, Command::Eviction as u8).is_err());
        assert!(replica_plane_admit(false, 0).is_err());
        assert!(replica_plane_admit(false, 30).is_err());
        for command in [5u8, 6, 7, 9, 10, 11, 12, 17, 18, 19, 20, 25, 29] {
            assert!(
                replica_plane_admit(false, command).is_ok(),
                "command {command}"
            );
        }
    }
}
