//! Script calls and the one funnel every write to Redis goes through.
//!
//! A [`Script`] is composed of Lua parts (shared preambles first) and run with `EVALSHA`, falling
//! back on `EVAL` when the server does not have it cached (after a restart, a `SCRIPT FLUSH` or a
//! failover); or, for a primitive whose layout is another library's, it is one plain command
//! ([`Script::command`]). [`write`] is the funnel: every command that changes Redis, a script call or
//! Redlock's `SET NX PX`, is sent through it, so that what must happen around every write
//! (replica sync, see `replicas.rs`; metrics) has exactly one place to live.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::engine::{key_slot, sha1_hex};
use crate::engine::{Connection, FromValue, Key, Sent, Value};
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;

use crate::engine::replicas::Writer;
use crate::error::{was_not_sent, Failure, RedisError, RedisErrorKind};

/// A script whose SHA1s are computed once per process.
///
/// It has a text for each way it can be sent, up to four: with or without the `allow-oom` flags
/// line (for scripts that free memory, on servers that know flags), and, for scripts that
/// announce an unlock, publishing with `PUBLISH` or with `SPUBLISH` (sharded pub/sub, on
/// clusters of Redis 7 and later, as Redisson does there). A script announces with
/// `redis.call(PUBLISH, ..)`; the local `PUBLISH` is set by the line each text starts with. A
/// script that does neither has one text.
pub(crate) struct Script {
    /// In the order [`Script::text`] reads them.
    texts: Vec<Text>,
    freeing: bool,
    publishes: bool,
    /// For a call that is one plain command, its name; its one text is that name.
    command: Option<&'static str>,
}

struct Text {
    sha: String,
    body: String,
}

/// The first line that gives a script flags (Redis 7): `allow-oom` lets a script that frees
/// memory run, and write what it must on the way (a hold count, a fence), on a server at
/// `maxmemory` that evicts nothing. Without it an unlock fails there, and the lock stays until
/// its lease ends.
const ALLOW_OOM: &str = "#!lua flags=allow-oom\n";

/// How a script's text names the command that announces an unlock.
const PUBLISH_CALL: &str = "redis.call(PUBLISH,";

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.command {
            Some(name) => f.debug_struct("Script").field("command", &name).finish(),
            None => f
                .debug_struct("Script")
                .field("sha", &self.text(false, false).sha)
                .finish(),
        }
    }
}

impl Script {
    /// A script made of `parts`, in order: shared functions first, then the script itself.
    pub(crate) fn new(parts: &[&str]) -> Script {
        Script::compose(parts, false)
    }

    /// A script that frees memory (a release, a renewal, a force unlock): sent with the
    /// `allow-oom` flag to servers that know script flags (Redis 7 and later, Valkey), and
    /// without it to older ones, which cannot parse the flags line.
    pub(crate) fn freeing(parts: &[&str]) -> Script {
        Script::compose(parts, true)
    }

    /// A call that is one plain Redis command instead of a script: `name`, then the call's keys,
    /// then its arguments, sent through the same funnel (a job lock's `SET NX PX`, which is
    /// ShedLock's layout, and which costs Redis less than a script doing the same).
    pub(crate) fn command(name: &'static str) -> Script {
        Script {
            texts: vec![Text {
                sha: String::new(),
                body: name.to_owned(),
            }],
            freeing: false,
            publishes: false,
            command: Some(name),
        }
    }

    fn compose(parts: &[&str], freeing: bool) -> Script {
        let body = parts.concat();
        let publishes = body.contains(PUBLISH_CALL);
        let text = |flags: bool, sharded: bool| {
            let flags = if flags { ALLOW_OOM } else { "" };
            let publish = match (publishes, sharded) {
                (false, _) => "",
                (true, false) => "local PUBLISH = 'publish'\n",
                (true, true) => "local PUBLISH = 'spublish'\n",
            };
            let body = [flags, publish, &body].concat();
            Text {
                sha: sha1_hex(&body),
                body,
            }
        };
        let mut texts = Vec::new();
        for sharded in [false, true].into_iter().take(1 + usize::from(publishes)) {
            for flags in [false, true].into_iter().take(1 + usize::from(freeing)) {
                texts.push(text(flags, sharded));
            }
        }
        Script {
            texts,
            freeing,
            publishes,
            command: None,
        }
    }

    /// The text for a server that knows flags or not, with sharded pub/sub or not: the texts are
    /// made flags first, each only where the script has it.
    fn text(&self, flags: bool, sharded: bool) -> &Text {
        let flags = usize::from(flags && self.freeing);
        let sharded = usize::from(sharded && self.publishes);
        &self.texts[sharded * (1 + usize::from(self.freeing)) + flags]
    }

    /// The whole text sent to a current server without sharded pub/sub (a command's name).
    pub(crate) fn body(&self) -> &str {
        &self.text(true, false).body
    }

    /// The SHA1 and text to send through `writer` on `redis`: flagged when the server knows
    /// flags (or when its version is not known yet; the connection learns it before the first
    /// reply), publishing as the writer's deployment does.
    fn for_server(&self, redis: &Connection, sharded: bool) -> (&str, &str) {
        let flags = self.freeing && redis.server_major().is_none_or(|major| major >= 7);
        let text = self.text(flags, sharded);
        (&text.sha, &text.body)
    }

    /// Runs the script: one round trip when the server has it cached, two the first time (a
    /// command: one).
    ///
    /// `call` makes the keys and arguments; it is called again only for the `EVAL` fallback,
    /// so the common path builds them once. The call goes through [`write`], so a call fred
    /// could not send is sent again once the connection is back.
    pub(crate) async fn run<'w, R: FromValue>(
        &self,
        writer: &'w Writer,
        call: impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, RedisError> {
        let call = &call;
        // With replica sync on a cluster, where to wait: the slot of the first key (every key of
        // a call is in one slot). Asked for only then, off the common path.
        let slot = || {
            if !writer.client.is_clustered() {
                return None;
            }
            call().0.first().map(|key| key_slot(key.as_bytes()))
        };
        write(
            writer,
            Attempts::UntilSent,
            slot,
            // No async block here: the connection's future is the call's own, so that the
            // futures of a caller's call stay as shallow as before the seam (rustc's query
            // depth, which a caller's `async fn` reaches at about 128 nested futures).
            |redis: &'w Connection| {
                let sent = match self.command {
                    Some(name) => Sent::Command(name),
                    None => {
                        let (sha, body) = self.for_server(redis, writer.sharded);
                        Sent::Script { sha, body }
                    }
                };
                redis.call(sent, call)
            },
        )
        .await
    }

    /// Runs the call a primitive made of this script; see [`run`](Self::run). `run`'s own
    /// future, not one wrapped around it: a caller's futures nest one level less (rustc's
    /// query depth).
    pub(crate) fn call<'s, R: FromValue>(
        &'s self,
        writer: &'s Writer,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> impl Future<Output = Result<R, RedisError>> + use<'s, R> {
        self.run(writer, move || (keys.clone(), args.clone()))
    }
}

/// Whether [`write`] may send a command again that fred could not send at all.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempts {
    /// A command that never ran (the connection being made again, a slot moving, a node
    /// between masters) is sent again once it can be, within the client's command timeout
    /// counted from the first send. Every lock script call. A public call made while the client
    /// knows it has no connection never gets here: it answers at once
    /// (`Connection::refused_unconnected`).
    UntilSent,
    /// Once, whatever happens: for a caller that bounds and orders its own requests (Redlock's
    /// per-node `SET NX PX`, whose release must come after it on the wire).
    Once,
}

/// The funnel of every write to Redis: sends the command `send` makes, as `attempts` says, on
/// the connection the writer gives it (with replica sync, one that then waits for the replicas).
///
/// `slot` says which cluster slot the command writes to; it is asked only when the writer syncs
/// replicas.
pub(crate) async fn write<'w, R, F, Fut>(
    writer: &'w Writer,
    attempts: Attempts,
    slot: impl FnOnce() -> Option<u16>,
    send: F,
) -> Result<R, RedisError>
where
    F: Fn(&'w Connection) -> Fut,
    Fut: Future<Output = Result<R, RedisError>>,
{
    let send = &send;
    writer
        .send(slot, |redis| async move {
            let mut resend: Option<Resend> = None;
            // What the server said when it refused the call last, once it has.
            let mut refused: Option<RedisError> = None;
            loop {
                let sent = match &resend {
                    None => send(redis).await,
                    // A call sent again answers within the command timeout of its first send,
                    // not one more command timeout after the connection came back.
                    // Boxed: off the common path, and the script call's future (kilobytes)
                    // inline twice would double every caller's (a debug build's stack).
                    Some(resend) => Box::pin(resend.bounded(send(redis))).await,
                };
                match sent {
                    Err(error) if attempts == Attempts::UntilSent && was_not_sent(&error) => {
                        // A call the client could not send fails at once: its first failure is
                        // its first send, and the clock is read only on this path.
                        LastRefusal::note(&error);
                        let resend =
                            resend.get_or_insert_with(|| Resend::new(redis, Instant::now()));
                        if !Box::pin(resend.wait(redis)).await {
                            return Err(error);
                        }
                        refused = Some(error);
                    }
                    // Sent again and cut off (fred cancels a call whose connection it drops as
                    // a slot moves): it may have run, and it still names the refusal before.
                    Err(error) if error.kind() == RedisErrorKind::NoReply => {
                        return Err(match &refused {
                            Some(refused) => error.after_refusal(refused),
                            None => error,
                        });
                    }
                    other => return other,
                }
            }
        })
        .await
}

tokio::task_local! {
    static LAST_REFUSAL: RefCell<Option<RedisError>>;
}

/// A call polled by [`LastRefusal::noting`].
pub(crate) type Noting<F> = TaskLocalFuture<RefCell<Option<RedisError>>, F>;

/// What last kept a call from running (a refusal, a connection being made again) while
/// [`write`] sent it again, for a caller whose own deadline may end the wait before the call's
/// command timeout does. An acquisition whose wait ends while its attempt is being sent again
/// (a slot in migration answering `ASK` or `TRYAGAIN`, say) would otherwise say only that Redis
/// could not be reached, and not why. Kept in the call's future itself: nothing is allocated.
pub(crate) struct LastRefusal;

impl LastRefusal {
    /// `call`, with what keeps it from running noted while it is polled. Polled elsewhere
    /// afterwards (an attempt handed to a task of its own), it notes nothing more.
    pub(crate) fn noting<F: Future>(call: F) -> Noting<F> {
        LAST_REFUSAL.scope(RefCell::new(None), call)
    }

    /// The last refusal `noting` noted, if any; it notes nothing after this.
    pub(crate) fn take<F: Future>(noting: Pin<&mut Noting<F>>) -> Option<RedisError> {
        noting.take_value().and_then(RefCell::into_inner)
    }

    fn note(error: &RedisError) {
        let _ = LAST_REFUSAL.try_with(|last| {
            if let Ok(mut last) = last.try_borrow_mut() {
                *last = Some(error.clone());
            }
        });
    }
}

/// Sending a call again, within one command timeout from its first send: a call fred could
/// not send (here), or a call safe to repeat whose reply was lost (a release, a leave).
pub(crate) struct Resend {
    until: Instant,
    pause: Duration,
}

impl Resend {
    /// Sending again until one command timeout after `first_sent`: a call's answer, sent once
    /// or many times, comes within that bound (and the one attempt still on its way).
    pub(crate) fn new(redis: &Connection, first_sent: Instant) -> Resend {
        Resend {
            until: first_sent + redis.command_timeout(),
            pause: Duration::from_millis(20),
        }
    }

    /// `sending`'s answer, or a lost reply once the command timeout of the first send has
    /// passed (the call may have gone out: what the command timeout of the library says too).
    pub(crate) async fn bounded<R>(
        &self,
        sending: impl Future<Output = Result<R, RedisError>>,
    ) -> Result<R, RedisError> {
        match tokio::time::timeout_at(self.until, sending).await {
            Ok(answer) => answer,
            Err(_) => Err(RedisError::new(
                RedisErrorKind::NoReply,
                Failure::Timeout,
                "no reply within the command timeout of the first send",
            )),
        }
    }

    /// Waits for the connection (or a pause); false once the command timeout has passed (then
    /// or during the wait). A
    /// call refused while connected (`TRYAGAIN` in a slot being moved, `CLUSTERDOWN`) waits the
    /// pause: waiting for a connection that is there would send it again at once, thousands of
    /// times a second, until the refusal ends.
    pub(crate) async fn wait(&mut self, redis: &Connection) -> bool {
        if Instant::now() >= self.until {
            return false;
        }
        let pause = tokio::time::sleep_until((Instant::now() + self.pause).min(self.until));
        if redis.is_connected() {
            pause.await;
        } else {
            tokio::select! {
                _ = redis.wait_for_connect() => {}
                _ = pause => {}
            }
        }
        self.pause = (self.pause * 2).min(Duration::from_secs(1));
        // At the bound, the refusal itself is the answer, not a send with no time left.
        Instant::now() < self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_has_a_text_per_way_it_can_be_sent() {
        let plain = Script::new(&["return 1"]);
        assert_eq!(plain.texts.len(), 1);
        assert_eq!(plain.text(true, true).body, "return 1");

        let both = Script::freeing(&["redis.call(PUBLISH, KEYS[1], 0)"]);
        assert_eq!(both.texts.len(), 4);
        let body = |flags, sharded| both.text(flags, sharded).body.as_str();
        assert!(!body(false, false).starts_with("#!") && body(false, false).contains("'publish'"));
        assert!(
            body(true, false).starts_with(ALLOW_OOM) && body(true, false).contains("'publish'")
        );
        assert!(!body(false, true).starts_with("#!") && body(false, true).contains("'spublish'"));
        assert!(body(true, true).starts_with(ALLOW_OOM) && body(true, true).contains("'spublish'"));
        assert_eq!(both.body(), body(true, false));

        let publishing = Script::new(&["redis.call(PUBLISH, KEYS[1], 0)"]);
        assert_eq!(publishing.texts.len(), 2);
        assert!(publishing.text(true, true).body.contains("'spublish'"));
        assert!(!publishing.text(true, false).body.starts_with("#!"));
    }
}
