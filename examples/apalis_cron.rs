//! A cron job that runs once per tick across instances, on apalis: three workers (here, three
//! clients in one process, each with its own apalis worker and `apalis-cron` scheduler) fire
//! `nightly-report` every two seconds; each hands its tick to `JobLock::run_tick`, keyed by the
//! instant the schedule fired for, so one worker runs each tick and the others skip it, however
//! their clocks and schedulers drift. The lock is ShedLock's Redis layout, so a Spring service
//! with `@SchedulerLock(name = "nightly-report")` would share the job.
//!
//! ```text
//! cargo run --example apalis_cron --features apalis
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set, otherwise a throw-away `redis-server` (which
//! must be on PATH).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use apalis::prelude::*;
use apalis_cron::{CronScheduler, Tick};
use fredlock::{JobLock, JobRun, LockClient};

mod throwaway;

use throwaway::redis_url;

/// Every two seconds (cron with seconds: `sec min hour day month weekday`).
const SCHEDULE: &str = "*/2 * * * * *";

/// Who ran each tick (its Unix second), across the workers.
type Ran = Arc<Mutex<BTreeMap<u64, Vec<String>>>>;

/// What each worker's handler is given: its name, its job lock, and where runs are noted.
#[derive(Clone)]
struct Instance {
    name: String,
    job: JobLock,
    ran: Ran,
}

/// What the job does: here, a little work that reports which instance did it.
async fn build_report(instance: &str) -> String {
    tokio::time::sleep(Duration::from_millis(100)).await;
    format!("report built by {instance}")
}

/// One tick on one worker: run once across the workers, keyed by the tick's scheduled time.
async fn handle_tick(tick: Tick, instance: Data<Instance>) -> Result<(), BoxDynError> {
    let second = tick.get_timestamp();
    let scheduled = SystemTime::UNIX_EPOCH + Duration::from_secs(second);
    match instance
        .job
        .run_tick(scheduled, build_report(&instance.name))
        .await?
    {
        JobRun::Ran(report) => {
            println!("tick {second}: {report}");
            let mut ran = instance.ran.lock().unwrap_or_else(|e| e.into_inner());
            ran.entry(second).or_default().push(instance.name.clone());
        }
        JobRun::Skipped(_) => println!("tick {second}: {} skipped", instance.name),
        JobRun::Lost => println!("tick {second}: {} lost the lock", instance.name),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;
    let ran: Ran = Arc::default();
    let mut clients = Vec::new();
    let mut workers = Vec::new();
    for n in 1..=3 {
        let client = LockClient::connect(&url).await?;
        let name = format!("instance-{n}");
        let job = client
            .job_lock("nightly-report")
            .host(name.clone())
            // A dead instance's lock ends by then; a run still going then is cancelled.
            .at_most_for(Duration::from_secs(60));
        let schedule = cron::Schedule::from_str(SCHEDULE)?;
        let worker = WorkerBuilder::new(format!("nightly-report-{n}"))
            .backend(CronScheduler::new(schedule))
            .data(Instance {
                name,
                job,
                ran: ran.clone(),
            })
            .build(handle_tick);
        // Nine seconds of ticks, then the worker stops.
        workers.push(tokio::spawn(worker.run_until(async {
            tokio::time::sleep(Duration::from_secs(9)).await;
            Ok::<(), std::io::Error>(())
        })));
        clients.push(client);
    }
    for worker in workers {
        worker.await??;
    }
    for client in clients {
        client.shutdown().await;
    }

    let ran = ran.lock().unwrap_or_else(|e| e.into_inner());
    println!("{} ticks, runs per tick:", ran.len());
    for (tick, instances) in ran.iter() {
        println!("  {tick}: {}", instances.join(", "));
    }
    if ran.len() < 3 || ran.values().any(|instances| instances.len() != 1) {
        return Err("a tick did not run exactly once".into());
    }
    println!("every tick ran exactly once");
    Ok(())
}
