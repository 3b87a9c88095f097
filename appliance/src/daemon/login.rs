//! Logins of the client plane: a password checked on the password thread (Argon2 costs
//! tens of milliseconds) unless the same credentials checked out lately, a personal
//! access token looked up, a failure answered after a delay, and on a backup a failed
//! check tried once more (it may not have applied the op that created the user yet). A
//! Register that checks out opens a session through the metadata primary.

use std::time::{Duration, Instant};

use replication::bus::ClientId;
use replication::wire::{Operation, RequestHeader};

use super::client::now_us;
use super::node::{Event, Node};
use super::passwords::Digest;
use crate::protocol::{ClientRequest, Credentials, Status};
use crate::state::{auth, MetadataOp, PasswordWork};

/// A failed login is answered after this delay (slows password guessing).
pub const LOGIN_FAILURE_DELAY: Duration = Duration::from_millis(500);
/// Password checks and hashes queued at once; more are answered Unavailable.
pub const LOGINS_IN_FLIGHT_MAX: usize = 16;

impl Node {
    /// Login, Register and LoginWithToken: each ends the connection's session and
    /// starts the check of the credentials it carries. False for any other request.
    pub(super) fn on_login_request(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        request: &ClientRequest<'_>,
    ) -> bool {
        if !matches!(
            request,
            ClientRequest::Login { .. }
                | ClientRequest::Register { .. }
                | ClientRequest::LoginWithToken { .. }
        ) {
            return false;
        }
        self.connections.entry(connection).or_default().user = None;
        if let ClientRequest::Register { version, .. } = request {
            if !crate::protocol::request::protocol_compatible(version.protocol_version) {
                self.reject("protocol_incompatible");
                self.answer(connection, header, Status::IncompatibleProtocol, &[]);
                return true;
            }
        }
        if !self.admit_in_flight(connection, header, true) {
            return true;
        }
        match request {
            ClientRequest::Login {
                username, password, ..
            }
            | ClientRequest::Register {
                credentials: Credentials::Password { username, password },
                ..
            } => self.start_login(connection, header, username, password, true),
            ClientRequest::Register {
                credentials: Credentials::Token(token),
                ..
            }
            | ClientRequest::LoginWithToken { token } => {
                self.token_login(connection, header, token, true)
            }
            _ => {}
        }
        true
    }

    /// A Register whose credentials checked out: the metadata primary mints the session
    /// (a backup forwards the verified user id).
    fn register(&mut self, connection: ClientId, header: &RequestHeader, user: u32) {
        let table = self.metadata().map(|r| r.clients());
        let known = table.is_some_and(|t| t.get(header.client).is_some());
        let sessions = table.map_or(0, |t| t.len());
        if !known && sessions >= self.settings.client_limits.sessions_max as usize {
            // Admitted sessions are never evicted to make room for a new one.
            self.reject("session_limit");
            return self.refuse_limit(connection, header, "session_limit");
        }
        self.client_connections.insert(header.client, connection);
        self.metadata_request(connection, header, user, Operation::Register, &[]);
    }

    /// Argon2 costs tens of milliseconds: the check runs on the password thread so the
    /// replica executor keeps its heartbeats; the result comes back as an event.
    /// Credentials that checked out lately are let in at once. A first check
    /// (`may_retry`) keeps the credentials for one retry on a backup.
    fn start_login(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        username: &str,
        password: &[u8],
        may_retry: bool,
    ) {
        let account = self
            .state
            .account(username)
            .map(|(id, hash)| (id, hash.to_owned()));
        let remember = account
            .as_ref()
            .map(|(_, hash)| self.verified_logins.digest(username, password, hash));
        if let (Some((id, _)), Some(digest)) = (&account, &remember) {
            if self.verified_logins.fresh(digest, Instant::now()) {
                self.login_counts.reused += 1;
                self.login_started(connection);
                return self.on_login_checked(connection, header, Some(*id), None, None);
            }
        }
        if self.logins_in_flight >= LOGINS_IN_FLIGHT_MAX {
            self.reject("login_busy");
            return self.answer(connection, header, Status::Unavailable, &[]);
        }
        let retry = may_retry.then(|| {
            Box::new(Credentials::Password {
                username: username.to_owned(),
                password: password.to_vec(),
            })
        });
        let password = password.to_vec();
        self.login_counts.password_checks += 1;
        let check = self.password_thread.run(move || match account {
            Some((id, hash)) => auth::verify_password(&password, &hash).then_some(id),
            None => {
                // Unknown names cost the same as known ones.
                auth::verify_password(&password, auth::decoy_hash());
                None
            }
        });
        self.login_started(connection);
        let events = self.events.clone();
        let request = Box::new(*header);
        glommio::spawn_local(async move {
            let user = check.await.flatten();
            let _ = events.try_send(Event::LoginChecked {
                connection,
                request,
                user,
                retry: if user.is_none() { retry } else { None },
                remember: remember.filter(|_| user.is_some()).map(Box::new),
            });
        })
        .detach();
    }

    /// Runs a CreateUser's or ChangePassword's Argon2 work on the password thread (within
    /// the password checks' bound); the op it yields comes back as an event.
    pub(super) fn start_password_work(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        user: u32,
        work: PasswordWork,
    ) {
        if self.logins_in_flight >= LOGINS_IN_FLIGHT_MAX {
            self.reject("login_busy");
            return self.answer(connection, header, Status::Unavailable, &[]);
        }
        self.logins_in_flight += 1;
        let done = self.password_thread.run(move || work.run());
        let events = self.events.clone();
        let request = Box::new(*header);
        glommio::spawn_local(async move {
            // Work that panicked (a bug, logged) is answered Unavailable.
            let op = Box::new(done.await.unwrap_or(Err(Status::Unavailable)));
            let _ = events.try_send(Event::PasswordWorkDone {
                connection,
                request,
                user,
                op,
            });
        })
        .detach();
    }

    pub(super) fn on_password_work_done(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        user: u32,
        op: Result<MetadataOp, Status>,
    ) {
        self.logins_in_flight = self.logins_in_flight.saturating_sub(1);
        if !self.connections.contains_key(&connection) {
            return; // closed meanwhile
        }
        match op {
            Ok(op) => {
                let body = op.encode();
                self.metadata_request(connection, header, user, op.operation(), &body);
            }
            // A wrong current password is answered as a failed login is.
            Err(Status::InvalidCredentials) => self.refuse_credentials(connection, header),
            Err(status) => self.answer(connection, header, status, &[]),
        }
    }

    /// A login with a personal access token: its hash is a lookup, not a slow check.
    fn token_login(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        token: &[u8],
        may_retry: bool,
    ) {
        let user = self.state.token_user(&auth::token_hash(token), now_us());
        self.login_started(connection);
        let retry =
            (may_retry && user.is_none()).then(|| Box::new(Credentials::Token(token.to_vec())));
        self.on_login_checked(connection, header, user, retry, None);
    }

    /// A login of `connection` is in flight until `on_login_checked` (counted against
    /// the node's and the connection's limits).
    fn login_started(&mut self, connection: ClientId) {
        self.logins_in_flight += 1;
        if let Some(entry) = self.connections.get_mut(&connection) {
            entry.logins += 1;
        }
    }

    /// The second check of a login a backup failed.
    pub(super) fn on_login_retry(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        credentials: Credentials,
    ) {
        if !self.connections.contains_key(&connection) {
            return; // closed meanwhile
        }
        match credentials {
            Credentials::Password { username, password } => {
                self.start_login(connection, header, &username, &password, false);
            }
            Credentials::Token(token) => self.token_login(connection, header, &token, false),
        }
    }

    pub(super) fn on_login_checked(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        user: Option<u32>,
        retry: Option<Box<Credentials>>,
        remember: Option<Box<Digest>>,
    ) {
        self.logins_in_flight = self.logins_in_flight.saturating_sub(1);
        if let Some(entry) = self.connections.get_mut(&connection) {
            entry.logins = entry.logins.saturating_sub(1);
        }
        // The user may have been deleted or deactivated while the check ran.
        let user = user.filter(|id| self.state.is_active(*id));
        let Some(entry) = self.connections.get_mut(&connection) else {
            return; // closed meanwhile
        };
        match user {
            Some(user) => {
                entry.user = Some(user);
                if let Some(digest) = remember {
                    self.verified_logins.insert(*digest, Instant::now());
                }
                if header.operation == Operation::Register as u8 {
                    self.register(connection, header, user);
                } else {
                    self.answer(connection, header, Status::Ok, &user.to_le_bytes());
                }
            }
            None => {
                entry.user = None;
                let primary = self.metadata().is_some_and(|r| r.is_primary());
                if let Some(credentials) = retry.filter(|_| !primary) {
                    // A backup may not have applied the op that created the user or
                    // set its password: checked once more after the failure delay.
                    let events = self.events.clone();
                    let request = Box::new(*header);
                    glommio::spawn_local(async move {
                        glommio::timer::sleep(LOGIN_FAILURE_DELAY).await;
                        let _ = events.try_send(Event::LoginRetry {
                            connection,
                            request,
                            credentials,
                        });
                    })
                    .detach();
                    return;
                }
                self.refuse_credentials(connection, header);
            }
        }
    }

    /// InvalidCredentials, counted `login_failed`, after `LOGIN_FAILURE_DELAY`.
    fn refuse_credentials(&mut self, connection: ClientId, header: &RequestHeader) {
        self.reject("login_failed");
        let frame = self.reply(header, Status::InvalidCredentials, &[]);
        let bus = self.bus.clone();
        glommio::spawn_local(async move {
            glommio::timer::sleep(LOGIN_FAILURE_DELAY).await;
            let _ = bus.send_to_client(connection, frame);
        })
        .detach();
    }
}
