//! A cron job that runs once per tick across instances: three instances (here, three clients
//! in one process, each with its own `tokio-cron-scheduler`) fire `nightly-report` every two
//! seconds; `run_tick` lets one of them run each tick and the others skip it, however their
//! clocks and schedulers drift. The lock is ShedLock's Redis layout, so a Spring service with
//! `@SchedulerLock(name = "nightly-report")` would share the job.
//!
//! ```text
//! cargo run --example scheduled_job --features cron
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set, otherwise a throw-away `redis-server` (which
//! must be on PATH).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fredlock::{JobRun, LockClient};
use tokio_cron_scheduler::{Job, JobScheduler};

mod throwaway;

use throwaway::redis_url;

/// Every two seconds (cron with seconds: `sec min hour day month weekday`).
const SCHEDULE: &str = "*/2 * * * * *";
const PERIOD: Duration = Duration::from_secs(2);

/// The tick a firing belongs to: the schedule's instant nearest to now. Every instance fires
/// the same tick within a fraction of the period of it, so they all name it alike.
fn this_tick(period: Duration) -> SystemTime {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let period_ms = period.as_millis();
    let tick_ms = (now.as_millis() + period_ms / 2) / period_ms * period_ms;
    SystemTime::UNIX_EPOCH + Duration::from_millis(tick_ms as u64)
}

/// What the job does: here, a little work that reports which instance did it.
async fn build_report(instance: &str) -> String {
    tokio::time::sleep(Duration::from_millis(100)).await;
    format!("report built by {instance}")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;
    // Who ran each tick, across the instances.
    let ran: Arc<Mutex<BTreeMap<u128, Vec<String>>>> = Arc::default();
    let mut instances = Vec::new();
    for n in 1..=3 {
        let client = LockClient::connect(&url).await?;
        let instance = format!("instance-{n}");
        let job = client
            .job_lock("nightly-report")
            .host(instance.clone())
            // A dead instance's lock ends by then; a run still going then is cancelled.
            .at_most_for(Duration::from_secs(60));
        let scheduler = JobScheduler::new().await?;
        let ran = ran.clone();
        scheduler
            .add(Job::new_async(SCHEDULE, move |_id, _scheduler| {
                let (job, instance, ran) = (job.clone(), instance.clone(), ran.clone());
                Box::pin(async move {
                    let tick = this_tick(PERIOD);
                    let tick_ms = tick
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis();
                    match job.run_tick(tick, build_report(&instance)).await {
                        Ok(JobRun::Ran(report)) => {
                            println!("tick {tick_ms}: {report}");
                            ran.lock()
                                .unwrap()
                                .entry(tick_ms)
                                .or_default()
                                .push(instance);
                        }
                        Ok(JobRun::Skipped(_)) => println!("tick {tick_ms}: {instance} skipped"),
                        Ok(JobRun::Lost) => println!("tick {tick_ms}: {instance} lost the lock"),
                        Err(error) => eprintln!("tick {tick_ms}: {instance} failed: {error}"),
                    }
                })
            })?)
            .await?;
        scheduler.start().await?;
        instances.push((client, scheduler));
    }

    tokio::time::sleep(Duration::from_secs(9)).await;
    for (client, mut scheduler) in instances {
        scheduler.shutdown().await?;
        client.shutdown().await;
    }

    let ran = ran.lock().unwrap();
    println!("{} ticks, runs per tick:", ran.len());
    for (tick, instances) in ran.iter() {
        println!("  {tick}: {}", instances.join(", "));
    }
    if ran.is_empty() || ran.values().any(|instances| instances.len() != 1) {
        return Err("a tick did not run exactly once".into());
    }
    println!("every tick ran exactly once");
    Ok(())
}
