use std::time::Duration;

use fredlock::{LockClient, ReplicaSync};

async fn with_replica_sync() -> fredlock::Result<LockClient> {
    LockClient::builder()
        .url("redis-sentinel://10.0.0.1:26379?sentinelServiceName=locks&node=10.0.0.2:26379")
        .replica_sync(ReplicaSync::replicas(1).timeout(Duration::from_millis(500)))
        .build()
        .await
}
