//! Releases for guards dropped without [`unlock`](crate::LockGuard::unlock): `Drop` only queues
//! the request, so it stays synchronous, cheap and safe outside a runtime; this task sends the
//! release script.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::client::Core;
use crate::guard::Release;

/// How long shutdown waits for queued releases before giving up on them (their leases still
/// end them).
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

pub(crate) async fn run(
    core: Arc<Core>,
    mut requests: UnboundedReceiver<Release>,
    shutdown: CancellationToken,
) {
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            request = requests.recv() => match request {
                Some(release) => { running.spawn(release.run_dropped(core.clone())); }
                None => break,
            },
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
    // Shutting down: finish what dropped guards asked for, within reason.
    while let Ok(release) = requests.try_recv() {
        running.spawn(release.run_dropped(core.clone()));
    }
    let drained = tokio::time::timeout(DRAIN_LIMIT, async {
        while running.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            pending = running.len(),
            "shutdown left releases unfinished; those locks end with their lease"
        );
    }
}
