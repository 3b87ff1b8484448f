//! The reentrant lock as it waited before issue 59's wake rule, and as Redisson's `RLock` still
//! waits: every waiting instance listens on the lock's shared unlock channel, and every unlock
//! wakes them all to try again. fredlock's own acquire and release scripts, sent by hand
//! without the line's keys (so a release names nobody), with Redisson's wait around them: the
//! growth table's "today's lock" of the issue, beside the wake rule that replaced it.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::Message;
use tokio::sync::{broadcast, Mutex, OnceCell};

use crate::libs::{BoxFuture, Handle, Held, Library};
use crate::scenarios::{raw_client, RawScripts};

/// The subject's name in the growth table.
pub const HERD: &str = "herd (Redisson's wake rule)";

/// One instance: a connection for the scripts and one for its subscriptions, as Redisson has.
pub struct HerdClient {
    commands: Client,
    subscriber: Client,
    scripts: Arc<RawScripts>,
    /// This instance's part of the owner field.
    id: String,
}

impl HerdClient {
    pub async fn connect(url: &str) -> HerdClient {
        let commands = raw_client(url).await;
        let subscriber = raw_client(url).await;
        let scripts = Arc::new(RawScripts::load(&commands).await);
        HerdClient {
            commands,
            subscriber,
            scripts,
            id: format!("herd-{}", rand::random::<u64>()),
        }
    }
}

impl Library for HerdClient {
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            // fred keeps a dropped client's connection open: its subscription would receive
            // every later subject's unlock messages.
            let _ = self.subscriber.quit().await;
            let _ = self.commands.quit().await;
        })
    }

    fn handle(&self, resource: &str) -> Box<dyn Handle> {
        Box::new(Arc::new(HerdHandle {
            commands: self.commands.clone(),
            subscriber: self.subscriber.clone(),
            scripts: self.scripts.clone(),
            name: resource.to_owned(),
            channel: format!("redisson_lock__channel:{{{resource}}}"),
            field: format!("{}:{}", self.id, rand::random::<u32>()),
            messages: Mutex::new(self.subscriber.message_rx()),
            subscribed: OnceCell::new(),
        }))
    }
}

pub struct HerdHandle {
    commands: Client,
    subscriber: Client,
    scripts: Arc<RawScripts>,
    name: String,
    channel: String,
    field: String,
    messages: Mutex<broadcast::Receiver<Message>>,
    subscribed: OnceCell<()>,
}

impl Handle for Arc<HerdHandle> {
    fn acquire(&self) -> BoxFuture<'_, Box<dyn Held>> {
        Box::pin(async move {
            let handle = self;
            handle
                .subscribed
                .get_or_init(|| async {
                    handle
                        .subscriber
                        .subscribe(handle.channel.as_str())
                        .await
                        .expect("herd subscribes");
                })
                .await;
            let mut messages = handle.messages.lock().await;
            loop {
                // What was published before this attempt is answered by it.
                while messages.try_recv().is_ok() {}
                let busy = handle
                    .scripts
                    .try_acquire(&handle.commands, &handle.name, &handle.field)
                    .await;
                let Some(ttl) = busy else {
                    return Box::new(handle.clone()) as Box<dyn Held>;
                };
                // Every unlock on the channel wakes every waiting instance; the lease bounds
                // the sleep, as Redisson's does.
                let sleep = Duration::from_millis(ttl.max(1) as u64);
                let _ = tokio::time::timeout(sleep, async {
                    loop {
                        match messages.recv().await {
                            Ok(message) if *message.channel == *handle.channel => return,
                            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                            Err(broadcast::error::RecvError::Closed) => return,
                        }
                    }
                })
                .await;
            }
        })
    }
}

impl Held for Arc<HerdHandle> {
    fn release(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            self.scripts
                .release(&self.commands, &self.name, &self.channel, &self.field)
                .await;
        })
    }
}
