//! A tower layer that serialises requests sharing a key across instances (feature `tower`):
//! two requests for the same account, order or tenant never run at once, on this instance or
//! any other on the same Redis; requests for different keys run in parallel.
//!
//! ```no_run
//! # async fn demo(client: fredlock::LockClient) {
//! use std::time::Duration;
//!
//! use axum::error_handling::HandleErrorLayer;
//! use axum::http::{Request, StatusCode};
//! use axum::{routing::post, BoxError, Router};
//! use fredlock::tower::{LockLayer, Locked};
//! use tower::ServiceBuilder;
//!
//! // The account in `/accounts/<id>/charge`; other paths take no lock.
//! let per_account = |request: &Request<axum::body::Body>| {
//!     let path = request.uri().path();
//!     let id = path.strip_prefix("/accounts/")?.strip_suffix("/charge")?;
//!     Some(format!("account:{id}"))
//! };
//! let app: Router = Router::new()
//!     .route("/accounts/{id}/charge", post(|| async { "charged" }))
//!     .layer(
//!         ServiceBuilder::new()
//!             .layer(HandleErrorLayer::new(|error: BoxError| async move {
//!                 if error.is::<Locked>() {
//!                     (StatusCode::LOCKED, error.to_string()) // 423: try again later
//!                 } else {
//!                     (StatusCode::SERVICE_UNAVAILABLE, error.to_string())
//!                 }
//!             }))
//!             .layer(LockLayer::new(client, per_account).wait(Duration::from_secs(2))),
//!     );
//! # }
//! ```
//!
//! The lock is held from before the inner service is called until its response future
//! completes (for a streamed body: until the headers are ready, not to the body's end), renewed
//! by the watchdog meanwhile, and given back when the future completes or is dropped (a client
//! that disconnects and whose request the server cancels). Each request is an owner of its own,
//! so two requests on one connection (or one task) exclude each other too.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::tower::{BoxError, Layer, Service};

use crate::client::LockClient;
use crate::family::DistributedLock;
use crate::owner::OwnerId;

/// How long a request waits for its key's lock unless told otherwise
/// ([`LockLayer::wait`]).
pub const DEFAULT_REQUEST_WAIT: Duration = Duration::from_secs(5);

/// What a request whose key stayed locked for the whole wait gets instead of a response, boxed
/// in the service's [`BoxError`]: map it to `423 Locked` (or `409 Conflict`) with
/// `error.is::<Locked>()`. Other errors are the inner service's, or a [`crate::Error`] when
/// Redis could not be asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locked {
    /// The lock's name (the key, after the client's key prefix).
    pub lock: String,
    /// How long the request waited.
    pub waited: Duration,
}

impl fmt::Display for Locked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is locked by another request (waited {:?})",
            self.lock, self.waited
        )
    }
}

impl std::error::Error for Locked {}

/// A [`Layer`] that runs each request under the lock its key names; see the
/// [module docs](self).
pub struct LockLayer<K> {
    client: LockClient,
    key: Arc<K>,
    wait: Duration,
}

impl<K> Clone for LockLayer<K> {
    fn clone(&self) -> Self {
        LockLayer {
            client: self.client.clone(),
            key: self.key.clone(),
            wait: self.wait,
        }
    }
}

impl<K> fmt::Debug for LockLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl<K> LockLayer<K> {
    /// Locks each request by the name `key` gives it (`None`: the request takes no lock), on
    /// `client`, waiting at most [`DEFAULT_REQUEST_WAIT`] for it.
    pub fn new(client: LockClient, key: K) -> LockLayer<K> {
        LockLayer {
            client,
            key: Arc::new(key),
            wait: DEFAULT_REQUEST_WAIT,
        }
    }

    /// How long a request waits for its key's lock before it fails with [`Locked`]; zero makes
    /// one attempt.
    pub fn wait(mut self, wait: Duration) -> LockLayer<K> {
        self.wait = wait;
        self
    }
}

impl<S, K> Layer<S> for LockLayer<K> {
    type Service = LockService<S, K>;

    fn layer(&self, inner: S) -> LockService<S, K> {
        LockService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`LockLayer`] makes.
pub struct LockService<S, K> {
    inner: S,
    layer: LockLayer<K>,
}

impl<S: Clone, K> Clone for LockService<S, K> {
    fn clone(&self) -> Self {
        LockService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, K> fmt::Debug for LockService<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

impl<S, K, Request> Service<Request> for LockService<S, K>
where
    S: Service<Request> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    K: Fn(&Request) -> Option<String> + Send + Sync + 'static,
    Request: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let Some(name) = (self.layer.key)(&request) else {
            let response = self.inner.call(request);
            return Box::pin(async move { response.await.map_err(Into::into) });
        };
        // The service made ready is the one to call; a clone takes its place for the next
        // request (tower's rule for a call that waits before it reaches the inner service).
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        // A request is an owner of its own: requests of one connection share a task.
        let lock = self.layer.client.lock(name).with_owner(OwnerId::unique());
        let wait = self.layer.wait;
        Box::pin(async move {
            // Held while the inner future runs, dropped with this future if the request is
            // cancelled (the guard's drop gives the lock back then), and dropped at the moment
            // the lock is lost (the watchdog could not renew it): a request must not go on
            // beside the next holder.
            let work = |_lost| async move {
                let response: Result<S::Response, BoxError> =
                    inner.call(request).await.map_err(Into::into);
                response
            };
            let held: crate::Result<Option<Result<S::Response, BoxError>>> =
                lock.try_with_lock(wait, None, work).await;
            match held {
                Ok(Some(response)) => response,
                Ok(None) => Err(Box::new(Locked {
                    lock: lock.name().to_owned(),
                    waited: wait,
                }) as BoxError),
                Err(error) => Err(Box::new(error) as BoxError),
            }
        })
    }
}
