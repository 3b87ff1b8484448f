use std::time::Duration;

use fredlock::tower::{ConcurrencyLimitLayer, LimitReached};
use fredlock::LockClient;
use tower::{BoxError, ServiceBuilder, ServiceExt};

async fn export(client: &LockClient, name: &str) -> Result<String, BoxError> {
    // At most 4 exports at once across every instance; a request waits 2 s at most for a permit.
    // One limit per key instead: ConcurrencyLimitLayer::per_key(client, |request| Some(..), 4).
    let exports = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(client.clone(), "exports", 4).wait(Duration::from_secs(2)))
        .service(tower::service_fn(|name: String| async move {
            Ok::<_, std::io::Error>(format!("exported {name}")) // the export's own error type
        }));
    match exports.oneshot(name.to_owned()).await {
        Err(error) if error.is::<LimitReached>() => Ok("busy: try again later".to_owned()), // 503
        other => other,
    }
}
