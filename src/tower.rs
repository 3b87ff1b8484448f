//! Tower layers over fredlock (feature `tower`).
//!
//! - [`LockLayer`] serialises requests sharing a key across instances: two requests for the
//!   same account, order or tenant never run at once, on this instance or any other on the same
//!   Redis; requests for different keys run in parallel.
//! - [`ConcurrencyLimitLayer`] lets at most N requests run at once across every instance, per
//!   key or for all: tower's `ConcurrencyLimitLayer` spread over a fleet, on leased permits that
//!   a crashed instance cannot keep.
//!
//! Both are made alike: `new(client, name, ..)` for one lock or limit every request shares,
//! `per_key(client, key, ..)` for one per key, where `key` is a [`RequestKey`] (a function
//! `Fn(&Request) -> Option<String>`; `None` lets the request through untouched); both have
//! `wait(d)`, and each makes the service of its name (`LockService`,
//! `ConcurrencyLimitService`).
//!
//! A [`LockLayer`] in front of a route:
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
//!             .layer(LockLayer::per_key(client, per_account).wait(Duration::from_secs(2))),
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

impl LockLayer<Global> {
    /// Runs every request under the one lock `name` on `client`: one request at a time across
    /// every instance, each waiting at most [`DEFAULT_REQUEST_WAIT`] for it.
    pub fn new(client: LockClient, name: impl Into<String>) -> LockLayer<Global> {
        LockLayer::per_key(client, Global(name.into()))
    }
}

impl<K> LockLayer<K> {
    /// Locks each request by the name `key` gives it (a [`RequestKey`]:
    /// `Fn(&Request) -> Option<String>`; `None`: the request takes no lock), on `client`,
    /// waiting at most [`DEFAULT_REQUEST_WAIT`] for it.
    pub fn per_key(client: LockClient, key: K) -> LockLayer<K> {
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
    K: RequestKey<Request> + Send + Sync + 'static,
    Request: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Boxed<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let Some(name) = self.layer.key.key_of(&request) else {
            return unguarded(&mut self.inner, request);
        };
        let mut inner = take_ready(&mut self.inner);
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

/// How long a request waits for a permit of a [`ConcurrencyLimitLayer`] unless told otherwise
/// ([`ConcurrencyLimitLayer::wait`]).
pub const DEFAULT_PERMIT_WAIT: Duration = Duration::from_secs(5);

/// What a request gets instead of a response when its limit had no permit free for the whole
/// wait, boxed in the service's [`BoxError`]: map it to `503 Service Unavailable` (or `429 Too
/// Many Requests`) with `error.is::<LimitReached>()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitReached {
    /// The limit's name: its permit semaphore's (after the client's key prefix).
    pub limit: String,
    /// How many requests it lets run at once, across every instance.
    pub max: u32,
    /// How long the request waited.
    pub waited: Duration,
}

impl fmt::Display for LimitReached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} already runs its {} request(s) at once across instances (waited {:?})",
            self.limit, self.max, self.waited
        )
    }
}

impl std::error::Error for LimitReached {}

/// What names the lock or the limit a request takes, for both layers: [`Global`] (one name for
/// every request), or a function of the request (`Fn(&Request) -> Option<String>`; `None`: the
/// request takes none and runs as it would without the layer).
pub trait RequestKey<Request> {
    /// The name of the lock or limit for `request`, or `None` to let it through untouched.
    fn key_of(&self, request: &Request) -> Option<String>;
}

impl<F, Request> RequestKey<Request> for F
where
    F: Fn(&Request) -> Option<String>,
{
    fn key_of(&self, request: &Request) -> Option<String> {
        self(request)
    }
}

/// One name for every request ([`LockLayer::new`], [`ConcurrencyLimitLayer::new`]).
#[derive(Clone, Debug)]
pub struct Global(String);

impl<Request> RequestKey<Request> for Global {
    fn key_of(&self, _: &Request) -> Option<String> {
        Some(self.0.clone())
    }
}

/// A [`Layer`] that lets at most `max` requests run at once across every instance sharing the
/// Redis: tower's `ConcurrencyLimitLayer` (`tower::limit`) spread over a fleet.
///
/// Each request takes a permit of a [`PermitSemaphore`](crate::PermitSemaphore) (one for all
/// requests, or one per key) before the inner service is called, and holds it until the
/// response future completes or is dropped (a client that goes away and whose request the
/// server cancels); the watchdog renews the permit's lease meanwhile, so the permits of an
/// instance that crashes come back once their lease ends (the client's
/// [`watchdog_lease`](crate::LockClientBuilder::watchdog_lease)). A request whose permit is
/// lost while it runs (no renewal got through in time) is stopped with
/// [`Error::Lost`](crate::Error::Lost): another instance may have its permit by then. A request
/// that found no permit free within its wait gets [`LimitReached`].
///
/// The semaphore gets `max` permits the first time this layer meets it
/// ([`try_set_permits`](crate::PermitSemaphore::try_set_permits), which leaves a semaphore
/// that has its permits alone: the first instance's `max` holds until changed with
/// [`add_permits`](crate::PermitSemaphore::add_permits)); a wait that ends without a permit
/// sets them again on the next request, should the semaphore have gone with its server.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) {
/// use std::time::Duration;
///
/// use axum::error_handling::HandleErrorLayer;
/// use axum::http::StatusCode;
/// use axum::{routing::post, BoxError, Router};
/// use fredlock::tower::{ConcurrencyLimitLayer, LimitReached};
/// use tower::ServiceBuilder;
///
/// // At most 4 exports run at once, whichever instance they reach.
/// let app: Router = Router::new()
///     .route("/exports", post(|| async { "exported" }))
///     .layer(
///         ServiceBuilder::new()
///             .layer(HandleErrorLayer::new(|error: BoxError| async move {
///                 if error.is::<LimitReached>() {
///                     (StatusCode::TOO_MANY_REQUESTS, error.to_string())
///                 } else {
///                     (StatusCode::SERVICE_UNAVAILABLE, error.to_string())
///                 }
///             }))
///             .layer(ConcurrencyLimitLayer::new(client, "exports", 4).wait(Duration::from_secs(2))),
///     );
/// # }
/// ```
///
/// # An inner service whose error is `BoxError`
///
/// The layer takes any inner error that converts into [`BoxError`] (`S::Error: Into<BoxError>`,
/// as tower's own layers do). An inner service whose error type *is* `BoxError` (a
/// `service_fn` whose closure returns `Result<_, BoxError>`), driven inside `tokio::spawn`,
/// meets a limitation of today's compiler when it checks that the spawned future is `Send`:
///
/// ```text
/// error: implementation of `From` is not general enough
///   = note: `Box<(dyn std::error::Error + Send + Sync + 'static)>` must implement
///           `From<Box<(dyn std::error::Error + Send + Sync + '0)>>`, for any lifetime `'0`...
/// ```
///
/// ```compile_fail
/// # async fn demo(client: fredlock::LockClient) {
/// use fredlock::tower::ConcurrencyLimitLayer;
/// use tower::{service_fn, BoxError, Layer, ServiceExt};
///
/// let layer = ConcurrencyLimitLayer::new(client, "exports", 4);
/// tokio::spawn(async move {
///     let limited = layer.layer(service_fn(|name: String| async move {
///         if name.is_empty() {
///             return Err::<String, BoxError>("empty".into());
///         }
///         Ok(name)
///     }));
///     limited.oneshot(String::from("export-1")).await
/// });
/// # }
/// ```
///
/// The way out is an error type of your own (or any concrete one, `std::io::Error` say): the
/// layer boxes it, and the handler reads it back with `error.downcast_ref::<Empty>()` beside
/// [`LimitReached`]. ([`LockLayer`] takes its inner error with the same bound; only this
/// layer's case is pinned by the tests above.)
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) {
/// use fredlock::tower::ConcurrencyLimitLayer;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// #[derive(Debug)]
/// struct Empty;
///
/// impl std::fmt::Display for Empty {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("no name given")
///     }
/// }
///
/// impl std::error::Error for Empty {}
///
/// let layer = ConcurrencyLimitLayer::new(client, "exports", 4);
/// let export = tokio::spawn(async move {
///     let limited = layer.layer(service_fn(|name: String| async move {
///         if name.is_empty() {
///             return Err(Empty);
///         }
///         Ok(name)
///     }));
///     limited.oneshot(String::from("export-1")).await
/// });
/// match export.await {
///     Ok(Ok(name)) => println!("exported {name}"),
///     Ok(Err(error)) if error.is::<Empty>() => println!("nothing to export"),
///     Ok(Err(error)) => println!("not exported: {error}"),
///     Err(panicked) => println!("the export task failed: {panicked}"),
/// }
/// # }
/// ```
pub struct ConcurrencyLimitLayer<K> {
    client: LockClient,
    key: Arc<K>,
    max: u32,
    wait: Duration,
    /// The semaphores this layer has given their permits.
    counted: Arc<dashmap::DashSet<String>>,
}

impl<K> Clone for ConcurrencyLimitLayer<K> {
    fn clone(&self) -> Self {
        ConcurrencyLimitLayer {
            client: self.client.clone(),
            key: self.key.clone(),
            max: self.max,
            wait: self.wait,
            counted: self.counted.clone(),
        }
    }
}

impl<K> fmt::Debug for ConcurrencyLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("max", &self.max)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLimitLayer<Global> {
    /// At most `max` requests at once across every instance, counted by the permit semaphore
    /// `name` on `client`; each waits at most [`DEFAULT_PERMIT_WAIT`] for a permit. A `max` of
    /// zero lets none run: each request gets [`LimitReached`] once its wait is over.
    pub fn new(
        client: LockClient,
        name: impl Into<String>,
        max: u32,
    ) -> ConcurrencyLimitLayer<Global> {
        ConcurrencyLimitLayer::per_key(client, Global(name.into()), max)
    }
}

impl<K> ConcurrencyLimitLayer<K> {
    /// At most `max` requests at once per key across every instance: `key` names each
    /// request's permit semaphore (a [`RequestKey`]: `Fn(&Request) -> Option<String>`; `None`
    /// lets the request run unlimited).
    pub fn per_key(client: LockClient, key: K, max: u32) -> ConcurrencyLimitLayer<K> {
        ConcurrencyLimitLayer {
            client,
            key: Arc::new(key),
            max,
            wait: DEFAULT_PERMIT_WAIT,
            counted: Arc::new(dashmap::DashSet::new()),
        }
    }

    /// How long a request waits for a permit before it fails with [`LimitReached`]; zero makes
    /// one attempt.
    pub fn wait(mut self, wait: Duration) -> ConcurrencyLimitLayer<K> {
        self.wait = wait;
        self
    }
}

impl<S, K> Layer<S> for ConcurrencyLimitLayer<K> {
    type Service = ConcurrencyLimitService<S, K>;

    fn layer(&self, inner: S) -> ConcurrencyLimitService<S, K> {
        ConcurrencyLimitService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`ConcurrencyLimitLayer`] makes.
pub struct ConcurrencyLimitService<S, K> {
    inner: S,
    layer: ConcurrencyLimitLayer<K>,
}

impl<S: Clone, K> Clone for ConcurrencyLimitService<S, K> {
    fn clone(&self) -> Self {
        ConcurrencyLimitService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, K> fmt::Debug for ConcurrencyLimitService<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitService")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

impl<S, K, Request> Service<Request> for ConcurrencyLimitService<S, K>
where
    S: Service<Request> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    K: RequestKey<Request> + Send + Sync + 'static,
    Request: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Boxed<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let Some(name) = self.layer.key.key_of(&request) else {
            return unguarded(&mut self.inner, request);
        };
        let mut inner = take_ready(&mut self.inner);
        let semaphore = self.layer.client.permit_semaphore(name);
        let (max, wait, counted) = (self.layer.max, self.layer.wait, self.layer.counted.clone());
        Box::pin(async move {
            if !counted.contains(semaphore.name()) {
                semaphore.try_set_permits(max).await?;
                counted.insert(semaphore.name().to_owned());
            }
            let Some(permit) = semaphore.try_acquire(wait, None).await? else {
                counted.remove(semaphore.name());
                return Err(Box::new(LimitReached {
                    limit: semaphore.name().to_owned(),
                    max,
                    waited: wait,
                }) as BoxError);
            };
            // Dropped with this future if the request is cancelled, and given back in the
            // background when it completes (the permit's drop), so that the response does not
            // wait for the release's round trip. The request runs as work under a hold: a
            // shutdown stops it and waits for it before it hands the permit over.
            match permit.while_held(inner.call(request)).await {
                Some(response) => response.map_err(Into::into),
                None => Err(Box::new(crate::Error::Lost {
                    lock: semaphore.name().to_owned(),
                    owner: permit.id().to_owned(),
                }) as BoxError),
            }
        })
    }
}

/// The boxed future both layers' services return.
type Boxed<Response> = Pin<Box<dyn Future<Output = Result<Response, BoxError>> + Send>>;

/// The service made ready, to call now; a clone takes its place for the next request (tower's
/// rule for a call that waits before it reaches the inner service).
fn take_ready<S: Clone>(inner: &mut S) -> S {
    let ready = inner.clone();
    std::mem::replace(inner, ready)
}

/// `request` sent to `inner` as it is: a request that takes no lock and no permit.
fn unguarded<S, Request>(inner: &mut S, request: Request) -> Boxed<S::Response>
where
    S: Service<Request>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    let response = inner.call(request);
    Box::pin(async move { response.await.map_err(Into::into) })
}
