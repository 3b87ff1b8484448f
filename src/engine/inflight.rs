//! Redis calls whose outcome must be observed even when their caller goes away.
//!
//! A command written to the connection runs on the server whether or not anyone reads the
//! reply. When the reply matters after cancellation (an acquire that won must be given back),
//! the call is wrapped in [`InFlight`]: polled inline while the caller waits, and moved into a
//! task of its own if the caller drops it mid-way. The common path thus costs no task spawn;
//! the value is dropped in that task, so its `Drop` does the undoing.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type BoxedCall<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A call that finishes even if dropped after its first poll.
pub(crate) struct InFlight<T: Send + 'static> {
    call: Option<BoxedCall<T>>,
    /// Whether the call was polled, i.e. may have been sent. An unpolled call sent nothing and is
    /// simply dropped.
    started: bool,
}

impl<T: Send + 'static> InFlight<T> {
    /// The call `make` makes, made straight into its box (see [`boxed`]).
    #[inline(always)]
    pub(crate) fn new<F>(make: impl FnOnce() -> F) -> InFlight<T>
    where
        F: Future<Output = T> + Send + 'static,
    {
        InFlight {
            call: Some(boxed(make)),
            started: false,
        }
    }
}

/// The future `make` makes, made straight into its box: one made first and boxed after is
/// copied whole, and a future holding fred's script call is kilobytes (that copy was over 1 000
/// instructions of every lock+unlock, by bench scenario 8). `Box::pin(make())` does not get
/// this: the box is allocated after the future is made.
#[inline(always)]
pub(crate) fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::<F>::new_uninit(), make()))
}

impl<T: Send + 'static> Future for InFlight<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = &mut *self;
        let Some(call) = this.call.as_mut() else {
            // Polled after completion: a caller bug, answered by never completing again.
            return Poll::Pending;
        };
        this.started = true;
        let output = std::task::ready!(call.as_mut().poll(cx));
        this.call = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for InFlight<T> {
    fn drop(&mut self) {
        if let (Some(call), true) = (self.call.take(), self.started) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    drop(call.await);
                });
            }
        }
    }
}
