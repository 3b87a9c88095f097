use super::*;
use replication::wire::Header;

fn prepared(connection: u64, client: u128, request: u64) -> Prepared {
    let mut header = RequestHeader::new();
    header.client = client;
    header.request = request;
    Prepared {
        connection: ClientId(connection),
        header,
    }
}

fn clients(list: &[Prepared]) -> Vec<(u128, u64)> {
    list.iter()
        .map(|p| (p.header.client, p.header.request))
        .collect()
}

#[test]
fn an_op_applied_with_its_own_request_hands_nothing_back() {
    let mut requests = PreparedRequests::default();
    requests.insert(7, 5, prepared(1, 0xa, 3));
    assert!(requests.applied(7, 5, Some((0xa, 3))).is_empty());
    // Settled once: a later op finds nothing left of it.
    assert!(requests.applied(7, 6, None).is_empty());
}

#[test]
fn an_op_taken_by_another_request_or_installed_over_hands_the_request_back() {
    let mut requests = PreparedRequests::default();
    requests.insert(7, 5, prepared(1, 0xa, 3));
    requests.insert(7, 6, prepared(2, 0xb, 1));
    requests.insert(7, 9, prepared(3, 0xc, 4));
    requests.insert(8, 5, prepared(4, 0xd, 2));
    // Op 6 carries another client's request; op 5 was never reported (installed over).
    let back = requests.applied(7, 6, Some((0xe, 1)));
    assert_eq!(clients(&back), [(0xa, 3), (0xb, 1)]);
    // The same client with another request number is another request too.
    let back = requests.applied(7, 9, Some((0xc, 5)));
    assert_eq!(clients(&back), [(0xc, 4)]);
    // Other groups are untouched.
    assert_eq!(clients(&requests.applied(8, 5, None)), [(0xd, 2)]);
}

#[test]
fn a_truncation_hands_back_what_was_prepared_above_it_in_that_group() {
    let mut requests = PreparedRequests::default();
    for (op, client) in [(4, 0xa), (5, 0xb), (6, 0xc)] {
        requests.insert(7, op, prepared(1, client, 1));
    }
    requests.insert(8, 6, prepared(2, 0xd, 1));
    assert_eq!(clients(&requests.truncated(7, 4)), [(0xb, 1), (0xc, 1)]);
    assert!(requests.truncated(7, u64::MAX).is_empty());
    assert_eq!(clients(&requests.applied(7, 4, Some((0xa, 1)))), []);
    requests.retain_groups(|group| group != 8);
    assert!(requests.truncated(8, 0).is_empty());
}
