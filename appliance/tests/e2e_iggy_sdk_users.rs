//! The official Apache Iggy Rust SDK (`iggy` 0.11.0) against a real node: users and
//! their permissions, personal access tokens, get_me / get_client(s) / get_stats,
//! UpdateStream and the purges, each through the SDK's own calls.

mod common;
#[path = "common/sdk.rs"]
mod sdk;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use iggy::prelude::{
    Client as _, Consumer, GlobalPermissions, Identifier, IggyClient, IggyDuration, IggyError,
    IggyExpiry, MessageClient, Partitioning, Permissions, PersonalAccessTokenClient,
    PollingStrategy, StreamClient, StreamPermissions, SystemClient, TopicClient,
    TopicCreateOptions, TopicPermissions, UserClient, UserStatus, UserUpdateOptions,
};
use sdk::*;

fn reader_of(stream: u32) -> Permissions {
    let mut streams = BTreeMap::new();
    streams.insert(
        stream as usize,
        StreamPermissions {
            read_stream: true,
            read_topics: true,
            poll_messages: true,
            ..Default::default()
        },
    );
    Permissions {
        global: GlobalPermissions::default(),
        streams: Some(streams),
    }
}

async fn login(
    files: &ClusterFiles,
    username: &str,
    password: &str,
) -> Result<IggyClient, IggyError> {
    let client = node_client(files, 0);
    client.connect().await.expect("connect");
    client.login_user(username, password).await.map(|_| client)
}

#[test]
fn the_sdk_manages_users_permissions_and_tokens() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    let runtime = runtime();
    let (alice_id, token) = runtime.block_on(async {
        let root = root_client(&files, 0).await;
        let stream = root.create_stream("orders").await.expect("stream").id;

        // Create: the reply is the user with the permissions as granted.
        let alice = root
            .create_user(
                "alice",
                "alice-password",
                UserStatus::Active,
                Some(reader_of(stream)),
            )
            .await
            .expect("create user");
        assert_eq!(alice.username, "alice");
        assert_eq!(alice.status, UserStatus::Active);
        assert_eq!(alice.permissions, Some(reader_of(stream)));
        assert!(alice.created_at.as_micros() > 0);
        let by_name = root
            .get_user(&Identifier::named("alice").unwrap())
            .await
            .expect("get user")
            .expect("alice exists");
        assert_eq!(by_name.id, alice.id);
        assert_eq!(by_name.permissions, Some(reader_of(stream)));
        let users = root.get_users().await.expect("users");
        let names: Vec<&str> = users.iter().map(|u| u.username.as_str()).collect();
        assert_eq!(names, ["root", "alice"]);
        let root_details = root
            .get_user(&Identifier::named("root").unwrap())
            .await
            .expect("get root")
            .expect("root exists");
        let all = root_details.permissions.expect("root holds every right");
        assert!(all.global.manage_servers && all.global.send_messages);
        assert!(root
            .get_user(&Identifier::named("nobody").unwrap())
            .await
            .expect("get unknown")
            .is_none());
        let taken = root
            .create_user("alice", "other-password", UserStatus::Active, None)
            .await;
        assert!(
            matches!(taken, Err(IggyError::UserAlreadyExists)),
            "{taken:?}"
        );

        // Grants the appliance cannot hold exactly are refused, never widened: half
        // a right, and a topic-level grant.
        let alice_ref = Identifier::numeric(alice.id).unwrap();
        let mut half = reader_of(stream);
        half.streams
            .as_mut()
            .unwrap()
            .get_mut(&(stream as usize))
            .unwrap()
            .read_topics = false;
        assert!(root
            .update_permissions(&alice_ref, Some(half))
            .await
            .is_err());
        let mut topic_level = reader_of(stream);
        topic_level
            .streams
            .as_mut()
            .unwrap()
            .get_mut(&(stream as usize))
            .unwrap()
            .topics = Some(BTreeMap::from([(1, TopicPermissions::default())]));
        assert!(root
            .update_permissions(&alice_ref, Some(topic_level))
            .await
            .is_err());
        let unchanged = root.get_user(&alice_ref).await.unwrap().unwrap();
        assert_eq!(unchanged.permissions, Some(reader_of(stream)));

        // A reader cannot manage users.
        let as_alice = login(&files, "alice", "alice-password")
            .await
            .expect("alice");
        let refused = as_alice
            .create_user("mallory", "mallory-password", UserStatus::Active, None)
            .await;
        assert!(
            matches!(refused, Err(IggyError::Unauthorized)),
            "{refused:?}"
        );
        // Her own record she may read; the others' not.
        assert!(as_alice.get_user(&alice_ref).await.unwrap().is_some());
        assert!(as_alice.get_users().await.is_err());
        // Whether another user exists is not told either.
        for other in ["root", "nobody"] {
            let denied = as_alice.get_user(&Identifier::named(other).unwrap()).await;
            assert!(matches!(denied, Err(IggyError::Unauthorized)), "{denied:?}");
        }

        // Update: rename and deactivate; an inactive user cannot log in and its open
        // sessions end.
        root.update_user(
            &alice_ref,
            Some("alicia"),
            Some(UserStatus::Inactive),
            &UserUpdateOptions::default(),
        )
        .await
        .expect("update user");
        let inactive = login(&files, "alicia", "alice-password").await;
        assert!(
            matches!(inactive, Err(IggyError::InvalidCredentials)),
            "{:?}",
            inactive.err()
        );
        assert!(as_alice.get_me().await.is_err(), "the session ended");
        root.update_user(
            &alice_ref,
            None,
            Some(UserStatus::Active),
            &UserUpdateOptions::default(),
        )
        .await
        .expect("reactivate");

        // Permissions: now a writer everywhere (the global send right).
        let writer = Permissions {
            global: GlobalPermissions {
                send_messages: true,
                ..Default::default()
            },
            streams: None,
        };
        root.update_permissions(&alice_ref, Some(writer.clone()))
            .await
            .expect("update permissions");
        let updated = root.get_user(&alice_ref).await.unwrap().unwrap();
        assert_eq!(updated.username, "alicia");
        assert_eq!(updated.status, UserStatus::Active);
        assert_eq!(updated.permissions, Some(writer));

        // Change password: the current one must match.
        let alicia = login(&files, "alicia", "alice-password")
            .await
            .expect("alicia");
        let wrong = alicia
            .change_password(&alice_ref, "not-her-password", "new-password")
            .await;
        assert!(
            matches!(wrong, Err(IggyError::InvalidCredentials)),
            "{wrong:?}"
        );
        alicia
            .change_password(&alice_ref, "alice-password", "new-password")
            .await
            .expect("change password");
        assert!(login(&files, "alicia", "alice-password").await.is_err());
        let alicia = login(&files, "alicia", "new-password")
            .await
            .expect("new password");

        // Personal access tokens: created, listed with their expiry, used to log in.
        let raw = alicia
            .create_personal_access_token("ci", IggyExpiry::NeverExpire)
            .await
            .expect("token");
        let hour = IggyExpiry::ExpireDuration(IggyDuration::from(3_600_000_000u64));
        let before = now_us();
        alicia
            .create_personal_access_token("short", hour)
            .await
            .expect("second token");
        let again = alicia
            .create_personal_access_token("ci", IggyExpiry::NeverExpire)
            .await;
        assert!(again.is_err(), "a name is used once per user");
        let tokens = alicia.get_personal_access_tokens().await.expect("tokens");
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens[0].name, "ci");
        assert!(tokens[0].expiry_at.is_none());
        let expiry = tokens[1].expiry_at.expect("an expiry").as_micros();
        assert!((before + 3_600_000_000..before + 3_700_000_000).contains(&expiry));
        assert!(root.get_personal_access_tokens().await.unwrap().is_empty());

        let by_token = node_client(&files, 0);
        by_token.connect().await.expect("connect");
        let identity = by_token
            .login_with_personal_access_token(&raw.token)
            .await
            .expect("token login");
        assert_eq!(identity.user_id, alice.id);
        // LoginWithPersonalAccessToken (44): the token authenticates a connection
        // without a new session, answering the user id.
        let mut raw_client = Client::connect(files.client_addr(0), 0x77).expect("connect");
        let reply = raw_client
            .read(44, &short(&raw.token))
            .expect("token login read");
        assert_eq!(reply.status(), Status::Ok);
        assert_eq!(u32_at(&reply.body, 0), alice.id);
        let bogus = node_client(&files, 0);
        bogus.connect().await.expect("connect");
        assert!(bogus
            .login_with_personal_access_token(&"0".repeat(64))
            .await
            .is_err());

        // get_me, get_client, get_clients: this connection, its user, its address.
        let me = by_token.get_me().await.expect("me");
        assert_eq!(me.user_id, Some(alice.id));
        assert!(me.address.starts_with("127."), "{}", me.address);
        assert_eq!(me.transport, "TCP");
        let clients = root.get_clients().await.expect("clients");
        assert!(clients
            .iter()
            .any(|c| c.client_id == me.client_id && c.user_id == Some(alice.id)));
        let same = root
            .get_client(me.client_id)
            .await
            .unwrap()
            .expect("listed");
        assert_eq!(same.address, me.address);
        assert!(root.get_client(u32::MAX - 1).await.unwrap().is_none());

        alicia
            .delete_personal_access_token("short")
            .await
            .expect("delete token");
        let left = alicia.get_personal_access_tokens().await.unwrap();
        assert_eq!(left.len(), 1);
        (alice.id, raw.token)
    });

    // Users and tokens are replicated state: they survive a restart.
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    runtime.block_on(async {
        let client = node_client(&files, 0);
        client.connect().await.expect("connect");
        let identity = client
            .login_with_personal_access_token(&token)
            .await
            .expect("token login after a restart");
        assert_eq!(identity.user_id, alice_id);
        let root = root_client(&files, 0).await;
        let alice_ref = Identifier::numeric(alice_id).unwrap();
        root.delete_user(&alice_ref).await.expect("delete user");
        assert!(root.get_user(&alice_ref).await.unwrap().is_none());
        assert!(
            client.get_me().await.is_err(),
            "a deleted user's session ends"
        );
        let gone = node_client(&files, 0);
        gone.connect().await.expect("connect");
        assert!(gone.login_with_personal_access_token(&token).await.is_err());
    });
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[test]
fn the_sdk_reads_stats_renames_streams_and_purges() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    runtime().block_on(async {
        let root = root_client(&files, 0).await;
        let stream = root.create_stream("events").await.expect("stream").id;
        let stream_ref = Identifier::numeric(stream).unwrap();
        for name in ["clicks", "views"] {
            root.create_topic(
                &stream_ref,
                name,
                &TopicCreateOptions {
                    partitions_count: Some(2),
                    ..Default::default()
                },
            )
            .await
            .expect("topic");
        }
        let clicks = Identifier::named("clicks").unwrap();
        let views = Identifier::named("views").unwrap();
        let payload = bytes::Bytes::from_static(b"0123456789abcdef");
        for topic in [&clicks, &views] {
            for partition in 0..2 {
                let mut messages = repeated(&payload, 10);
                root.send_messages(
                    &stream_ref,
                    topic,
                    &Partitioning::partition_id(partition),
                    &mut messages,
                )
                .await
                .expect("send");
            }
        }

        // Stats: this process, this host, and what the node stores.
        let stats = root.get_stats().await.expect("stats");
        assert_eq!(stats.process_id, daemon.pid() as u32);
        assert_eq!(stats.streams_count, 1);
        assert_eq!(stats.topics_count, 2);
        assert_eq!(stats.partitions_count, 4);
        assert_eq!(stats.messages_count, 40);
        assert!(stats.messages_size_bytes.as_bytes_u64() > 40 * 16);
        assert!(stats.segments_count >= 4);
        assert!(stats.clients_count >= 1);
        assert!(stats.memory_usage.as_bytes_u64() > 0);
        assert!(stats.total_memory.as_bytes_u64() >= stats.available_memory.as_bytes_u64());
        assert!(stats.total_disk_space.as_bytes_u64() > 0);
        assert!(stats.threads_count >= 1);
        assert!(!stats.hostname.is_empty());
        assert!(!stats.kernel_version.is_empty());

        // UpdateStream renames; the old name is gone, the new one resolves.
        root.update_stream(&stream_ref, "events-v2", &Default::default())
            .await
            .expect("update stream");
        let renamed = root
            .get_stream(&Identifier::named("events-v2").unwrap())
            .await
            .unwrap()
            .expect("found by its new name");
        assert_eq!(renamed.id, stream);
        assert!(root
            .get_stream(&Identifier::named("events").unwrap())
            .await
            .unwrap()
            .is_none());

        // PurgeTopic: the topic's messages are gone, the other topic's stay, and
        // offsets go on from where they were.
        root.purge_topic(&stream_ref, &clicks)
            .await
            .expect("purge topic");
        let consumer = Consumer::new(Identifier::numeric(1).unwrap());
        let poll = |topic: Identifier, strategy: PollingStrategy| {
            let root = &root;
            let stream_ref = stream_ref.clone();
            let consumer = consumer.clone();
            async move {
                root.poll_messages(
                    &stream_ref,
                    &topic,
                    Some(0),
                    &consumer,
                    &strategy,
                    100,
                    false,
                )
                .await
                .expect("poll")
            }
        };
        assert!(poll(clicks.clone(), PollingStrategy::offset(0))
            .await
            .messages
            .is_empty());
        assert_eq!(
            poll(views.clone(), PollingStrategy::offset(0))
                .await
                .messages
                .len(),
            10
        );
        let mut more = repeated(&payload, 3);
        root.send_messages(
            &stream_ref,
            &clicks,
            &Partitioning::partition_id(0),
            &mut more,
        )
        .await
        .expect("send after the purge");
        let after = poll(clicks.clone(), PollingStrategy::first()).await;
        let offsets: Vec<u64> = after.messages.iter().map(|m| m.header.offset).collect();
        assert_eq!(offsets, [10, 11, 12]);

        // PurgeStream: every topic of the stream.
        root.purge_stream(&stream_ref).await.expect("purge stream");
        for topic in [&clicks, &views] {
            let polled = poll(topic.clone(), PollingStrategy::offset(0)).await;
            assert!(polled.messages.is_empty());
            let details = root
                .get_topic(&stream_ref, topic)
                .await
                .unwrap()
                .expect("topic");
            assert_eq!(details.messages_count, 0);
        }
        let unknown = root
            .purge_topic(&stream_ref, &Identifier::named("nope").unwrap())
            .await;
        assert!(unknown.is_err());
    });
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
}

#[test]
fn on_three_nodes_users_tokens_and_purges_reach_every_node() {
    const NODES: usize = 3;
    let files = ClusterFiles::new(NODES);
    let mut daemons = cluster(&files);
    let (user_id, token) = runtime().block_on(async {
        // The SDK finds the leader itself.
        let root = root_client(&files, 1).await;
        let stream = root.create_stream("audit").await.expect("stream").id;
        let stream_ref = Identifier::numeric(stream).unwrap();
        root.create_topic(
            &stream_ref,
            "log",
            &TopicCreateOptions {
                partitions_count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("topic");
        let payload = bytes::Bytes::from_static(b"an audit line");
        let mut messages = repeated(&payload, 5);
        root.send_messages(
            &stream_ref,
            &Identifier::named("log").unwrap(),
            &Partitioning::partition_id(0),
            &mut messages,
        )
        .await
        .expect("send");
        let user = root
            .create_user(
                "auditor",
                "auditor-password",
                UserStatus::Active,
                Some(reader_of(stream)),
            )
            .await
            .expect("create user");
        // At once, on every node: a backup that has not applied the new user yet
        // checks the login again after the failure delay instead of refusing it.
        for replica in 0..NODES {
            let mut raw = Client::connect(files.client_addr(replica), 0x800 + replica as u128)
                .expect("connect");
            let login = raw.login("auditor", "auditor-password").expect("login");
            assert_eq!(login.status(), Status::Ok, "node {replica}");
        }
        let auditor = node_client(&files, 2);
        auditor.connect().await.expect("connect");
        auditor
            .login_user("auditor", "auditor-password")
            .await
            .expect("login");
        let token = auditor
            .create_personal_access_token("nightly", IggyExpiry::NeverExpire)
            .await
            .expect("token");
        for replica in 0..NODES {
            let mut raw = Client::connect(files.client_addr(replica), 0x810 + replica as u128)
                .expect("connect");
            let login = raw.read(44, &short(&token.token)).expect("token login");
            assert_eq!(login.status(), Status::Ok, "node {replica}");
        }
        root.purge_topic(&stream_ref, &Identifier::named("log").unwrap())
            .await
            .expect("purge");
        (user.id, token.token)
    });
    // Every node holds the user, the token and the purge: each answers a password
    // login, a token login, and a poll from offset 0 with no messages.
    for replica in 0..NODES {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut raw = Client::connect(files.client_addr(replica), 0x900 + replica as u128)
                .expect("connect");
            let by_password = raw.login("auditor", "auditor-password").expect("login");
            let by_token = raw.read(44, &short(&token)).expect("token login");
            let polled = raw.read(POLL, &poll_body(1, 1, 0, 0, 10)).expect("poll");
            let settled = by_password.status() == Status::Ok
                && by_token.status() == Status::Ok
                && polled.status() == Status::Ok
                && u32_at(&polled.body, 12) == 0;
            if settled {
                assert_eq!(u32_at(&by_password.body, 0), user_id);
                assert_eq!(u32_at(&by_token.body, 0), user_id);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {replica}: password {:?}, token {:?}, poll {:?} with {} messages",
                by_password.status(),
                by_token.status(),
                polled.status(),
                polled
                    .body
                    .get(12..16)
                    .map_or(0, |_| u32_at(&polled.body, 12))
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for daemon in &mut daemons {
        assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
    }
}

/// The `logins` counters of /stats, (password checks, logins let in without one), once
/// they read `want` (the stats are published about once a second), or as last read.
fn login_counts(files: &ClusterFiles, want: (u64, u64)) -> (u64, u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let logins = stats(files, 0)["logins"].clone();
        let count = |key: &str| {
            logins[key]
                .as_u64()
                .unwrap_or_else(|| panic!("{key}: {logins}"))
        };
        let seen = (count("password_checks"), count("reused"));
        if seen == want || std::time::Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn credentials_that_checked_out_log_in_again_without_a_password_check() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    let runtime = runtime();
    runtime.block_on(async {
        let root = root_client(&files, 0).await;
        let alice_ref = Identifier::named("alice").unwrap();
        root.create_user("alice", "alice-password", UserStatus::Active, None)
            .await
            .expect("create user");
        // The root login so far.
        let (checks, reused) = login_counts(&files, (1, 0));

        // The first login is checked; the next ones, on new connections, are not.
        for _ in 0..3 {
            login(&files, "alice", "alice-password")
                .await
                .expect("alice");
        }
        let want = (checks + 1, reused + 2);
        assert_eq!(login_counts(&files, want), want);

        // A wrong password is always checked (and refused).
        assert!(login(&files, "alice", "alice-passwore").await.is_err());
        let want = (checks + 2, reused + 2);
        assert_eq!(login_counts(&files, want), want);

        // A changed password: the old one is checked again, and refused.
        let alice = login(&files, "alice", "alice-password").await.unwrap();
        let want = (checks + 2, reused + 3);
        assert_eq!(login_counts(&files, want), want);
        alice
            .change_password(&alice_ref, "alice-password", "new-password")
            .await
            .expect("change password");
        assert!(login(&files, "alice", "alice-password").await.is_err());
        let want = (checks + 3, reused + 3);
        assert_eq!(login_counts(&files, want), want);
        login(&files, "alice", "new-password").await.expect("new");
        login(&files, "alice", "new-password").await.expect("new");
        let want = (checks + 4, reused + 4);
        assert_eq!(login_counts(&files, want), want);

        // A deactivated user is refused even with credentials that checked out: it has
        // no account to log in to, and is checked like an unknown name.
        root.update_user(
            &alice_ref,
            None,
            Some(UserStatus::Inactive),
            &UserUpdateOptions::default(),
        )
        .await
        .expect("deactivate");
        let inactive = login(&files, "alice", "new-password").await;
        assert!(
            matches!(inactive, Err(IggyError::InvalidCredentials)),
            "{:?}",
            inactive.err()
        );
        let want = (checks + 5, reused + 4);
        assert_eq!(login_counts(&files, want), want);
    });
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
}
