//! The differential harness every model's test against the real scripts shares: loading a
//! model's server state into Redis, reading it back, and the real replies as the model's.

use super::*;

/// One tick of the model, in milliseconds on the real server: long enough that no key expires
/// while a case runs.
pub(crate) const TICK_MS: i64 = 10_000;

/// Whether `pttl` (ms) is the model's `ticks` to the millisecond: less the moments since the
/// case was loaded (under a second), not only the same tick once rounded up (a lease set 9 s
/// short would read as the same tick).
pub(crate) fn within_ticks(pttl: i64, ticks: u8) -> bool {
    let expected = i64::from(ticks) * TICK_MS;
    pttl <= expected && pttl > expected - 1_000
}

/// The first key's reply of a renewal batch, after checking the second key's against the
/// model's `second` (when the batch had one, counted in `batches`): each key is answered as if
/// renewed alone.
pub(crate) fn first_of_batch(
    got: Result<Value, fred::error::Error>,
    second: Option<Reply>,
    (case, what): (usize, &str),
    batches: &mut usize,
) -> Reply {
    if let (Some(expected), Ok(Value::Array(replies))) = (second, &got) {
        *batches += 1;
        let second_reply = replies.get(1).cloned().unwrap_or(Value::Null);
        assert_eq!(
            reply(Ok(second_reply), false),
            expected,
            "case {case}: the batch's second {what}"
        );
    }
    let got = match got {
        Ok(Value::Array(replies)) => Ok(replies[0].clone()),
        other => other,
    };
    reply(got, false)
}

/// Checks that `key`'s PTTL is the model's `ticks` to the millisecond ([`within_ticks`]).
pub(crate) async fn assert_pttl(raw: &Client, key: &str, ticks: u8, case: usize) {
    let pttl: i64 = raw.pttl(key).await.unwrap();
    assert!(
        within_ticks(pttl, ticks),
        "case {case}: {key}'s PTTL {pttl} ms, the model's {ticks} ticks"
    );
}

/// Checks an end kept as a zset score (ms on the server's clock: a fair lock's place, a
/// permit's lease) to the millisecond: as loaded for the model's `ends` (`base + ends` ticks),
/// or set by the call to its length, `ends - now` ticks, from the server's clock during the
/// call (`clock`: read before and after it, ms). Whether the call set it.
pub(crate) fn end_set(
    case: usize,
    what: &str,
    score: f64,
    (base, now, ends): (i64, u8, u8),
    clock: (i64, i64),
) -> bool {
    let loaded = (base + i64::from(ends) * TICK_MS) as f64;
    let length = i64::from(ends.saturating_sub(now)) * TICK_MS;
    let set_now = (clock.0 + length) as f64..=(clock.1 + length) as f64;
    assert!(
        score == loaded || set_now.contains(&score),
        "case {case}: {what} ends at {score} ms, neither as loaded ({loaded}) nor {length} ms \
         from the call ({set_now:?})"
    );
    score != loaded
}

/// Random cases each differential test runs: 1000 (about a second each); at 400 a model's
/// renewal of a writer's read holds, which the script leaves to their own guards, went unseen.
pub(crate) const CASES: usize = 1000;

/// The fenced lock's token counter in the differential test.
pub(crate) const COUNTER: &str = "{model}:counter";

pub(crate) fn field(owner: Owner) -> String {
    format!("1b4e28ba-2fa1-11d2-883f-0016d3cca427:{owner}")
}

/// Writes `server` to Redis at key `name` (its fences at `fences`), as of server tick `now`.
pub(crate) async fn load(raw: &Client, name: &str, fences: &str, server: &Server, now: u8) {
    let _: i64 = raw.del(vec![name, fences, COUNTER]).await.unwrap();
    if let Some(counter) = server.counter {
        let _: () = raw.set(COUNTER, counter, None, None, false).await.unwrap();
    }
    if !server.holds.is_empty() {
        let fields: Vec<(String, u32)> = server
            .holds
            .iter()
            .map(|(&owner, &count)| (field(owner), count))
            .collect();
        let _: i64 = raw.hset(name, fields).await.unwrap();
        if let Some((owner, epoch)) = server.term {
            let record = [
                ("leader:identity", format!("pod-{owner}")),
                ("leader:epoch", epoch.to_string()),
                ("leader:since", "1795000000000".to_string()),
            ];
            let _: i64 = raw.hset(name, record.to_vec()).await.unwrap();
        }
        let ms = i64::from(server.expires - now) * TICK_MS;
        let _: bool = raw.pexpire(name, ms, None).await.unwrap();
    }
    if !server.fences.is_empty() {
        let members: Vec<String> = server
            .fences
            .iter()
            .map(|&(owner, req)| format!("{}:{req}", field(owner)))
            .collect();
        let _: i64 = raw.sadd(fences, members).await.unwrap();
    }
}

/// Reads Redis back as the model's server at tick `now`.
pub(crate) async fn read(raw: &Client, name: &str, fences: &str, now: u8) -> Server {
    let fields: std::collections::HashMap<String, String> = raw.hgetall(name).await.unwrap();
    let mut server = Server::default();
    for (key, value) in &fields {
        if !key.starts_with("leader:") {
            let owner = owner_of(key);
            server.holds.insert(owner, value.parse().unwrap());
        }
    }
    if let (Some(identity), Some(epoch)) =
        (fields.get("leader:identity"), fields.get("leader:epoch"))
    {
        let owner = identity.strip_prefix("pod-").unwrap().parse().unwrap();
        server.term = Some((owner, epoch.parse().unwrap()));
    }
    if !server.holds.is_empty() {
        let pttl: i64 = raw.pttl(name).await.unwrap();
        server.expires = now + ((pttl + TICK_MS - 1) / TICK_MS) as u8;
    }
    server.counter = raw.get(COUNTER).await.unwrap();
    let members: Vec<String> = raw.smembers(fences).await.unwrap();
    for member in members {
        let mut parts = member.rsplitn(3, ':');
        let req = parts.next().unwrap().parse().unwrap();
        let owner = parts.next().unwrap().parse().unwrap();
        server.fences.insert((owner, req));
    }
    server
}

/// An acquire step of the model: server, now, owner, lease, holds, request id, lost ids.
pub(crate) type Step = fn(&mut Server, u8, Owner, u8, u32, Req, &[Req]) -> Reply;

/// The real script's reply as the model's.
pub(crate) fn reply(value: Result<Value, fred::error::Error>, millis: bool) -> Reply {
    match value {
        Ok(Value::Null) => Reply::Nil,
        Ok(Value::Integer(n)) if millis && n > 0 => Reply::Int((n + TICK_MS - 1) / TICK_MS),
        Ok(Value::Integer(n)) => Reply::Int(n),
        Ok(Value::Array(pair)) => match pair.as_slice() {
            [Value::Integer(token), Value::Integer(afresh)] => {
                Reply::Token(*token as u64, *afresh == 1)
            }
            other => panic!("unexpected reply {other:?}"),
        },
        Err(error) if error.details().contains("STALE") => Reply::Stale,
        other => panic!("unexpected reply {other:?}"),
    }
}

/// The owner whose field is `field` (see [`field`]).
pub(crate) fn owner_of(field: &str) -> Owner {
    field.rsplit(':').next().unwrap().parse().unwrap()
}
