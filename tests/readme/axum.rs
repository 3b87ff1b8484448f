use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::{Request, StatusCode};
use axum::{routing::post, BoxError, Router};
use fredlock::tower::{LockLayer, Locked};
use fredlock::LockClient;
use tower::ServiceBuilder;

fn app(client: LockClient) -> Router {
    // The lock of `/accounts/<id>/charge` is its account; other requests take none.
    let per_account = |request: &Request<axum::body::Body>| {
        let path = request.uri().path();
        let id = path.strip_prefix("/accounts/")?.strip_suffix("/charge")?;
        Some(format!("account:{id}"))
    };
    Router::new()
        .route("/accounts/{id}/charge", post(|| async { "charged" }))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|error: BoxError| async move {
                    if error.is::<Locked>() {
                        (StatusCode::LOCKED, error.to_string()) // waited 2 s: try again later
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, error.to_string())
                    }
                }))
                .layer(LockLayer::per_key(client, per_account).wait(Duration::from_secs(2))),
        )
}
