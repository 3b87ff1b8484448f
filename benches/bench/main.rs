//! fredlock's benchmark: lock cost against the Redis round trip, and against other lock crates.
//!
//! ```text
//! cargo bench -p fredlock-bench                # the full run (about 7 minutes, 10 more for 14-17)
//! cargo bench -p fredlock-bench -- --quick       # a short smoke run
//! cargo bench -p fredlock-bench -- --json        # JSON on stdout, the table on stderr
//! cargo bench -p fredlock-bench -- --only 1,3    # some scenarios
//! cargo bench -p fredlock-bench -- --chart PATH  # where the wake-up chart goes (the uncontended
//!                                                # one goes beside it)
//! cargo bench -p fredlock-bench -- --locks N     # locks and waiters in scenarios 5, 6, 9
//! cargo bench -p fredlock-bench -- --watchdog S  # scenario 5's watchdog lease in seconds
//!                                                # (3 unless given; the default client's is 30)
//! cargo bench -p fredlock-bench -- --current-thread  # one runtime thread instead of one per core
//! cargo bench -p fredlock-bench -- --only 8      # instructions per cycle under valgrind callgrind
//! cargo bench -p fredlock-bench -- --only 13     # the job lock against rslock
//! cargo bench -p fredlock-bench -- --only 14     # 1 to 64 instances on one lock
//! cargo bench -p fredlock-bench -- --only 15,16  # 1 000 to 100 000 held locks, and waiting
//!                                                # tasks on many names
//! cargo bench -p fredlock-bench -- --only 17     # a three-master cluster against one server
//! cargo bench -p fredlock-bench -- --only 18     # where an uncontended cycle's time goes
//! ```
//!
//! It starts its own throw-away `redis-server` on a free loopback port (the test harness's) and
//! points every library at it, and only at it. Each scenario runs after a warm-up and repeats;
//! rows give the median with min and max over the rounds. See BENCHMARKS.md.

#[path = "../../tests/common/mod.rs"]
mod harness;

mod breakdown;
mod chart;
mod growth;
mod herd;
mod instructions;
mod job;
mod leader;
mod libs;
mod measure;
mod recording;
mod redlock;
mod rw;
mod scenarios;
mod semaphore;

use std::path::PathBuf;

use measure::Summary;
use serde_json::json;

#[global_allocator]
static ALLOCATOR: measure::CountingAlloc = measure::CountingAlloc;

/// One line of the result table.
pub struct Row {
    scenario: String,
    library: String,
    metric: String,
    unit: String,
    summary: Summary,
}

impl Row {
    pub fn new(scenario: &str, library: &str, metric: &str, unit: &str, summary: Summary) -> Row {
        Row {
            scenario: scenario.into(),
            library: library.into(),
            metric: metric.into(),
            unit: unit.into(),
            summary,
        }
    }

    pub fn single(scenario: &str, library: &str, metric: &str, unit: &str, value: f64) -> Row {
        Row::new(scenario, library, metric, unit, Summary::of(&[value]))
    }

    pub fn ratio(scenario: &str, what: &str, value: f64) -> Row {
        Row::single(scenario, what, "ratio of medians", "x", value)
    }

    fn median(&self) -> f64 {
        self.summary.median
    }
}

struct Options {
    current_thread: bool,
    locks: Option<usize>,
    watchdog: Option<u64>,
    json: bool,
    quick: bool,
    only: Option<Vec<u8>>,
    chart: PathBuf,
}

fn options() -> Options {
    let mut options = Options {
        current_thread: false,
        locks: None,
        watchdog: None,
        json: false,
        quick: false,
        only: None,
        // Beside the build, wherever cargo runs the benchmark from.
        chart: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/bench/wakeup-latency.svg"
        )),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => options.json = true,
            "--quick" => options.quick = true,
            "--current-thread" => options.current_thread = true,
            "--locks" => options.locks = args.next().and_then(|n| n.parse().ok()),
            "--watchdog" => match args.next().and_then(|n| n.parse().ok()) {
                Some(seconds) if seconds >= 3 => options.watchdog = Some(seconds),
                _ => {
                    eprintln!("--watchdog takes whole seconds, at least 3 (a period of 1 s)");
                    std::process::exit(2);
                }
            },
            "--only" => {
                options.only = args.next().map(|list| {
                    list.split(',')
                        .filter_map(|n| n.trim().parse().ok())
                        .collect()
                })
            }
            "--chart" => {
                if let Some(path) = args.next() {
                    options.chart = PathBuf::from(path);
                }
            }
            // `cargo bench` passes --bench; nothing else is expected.
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other}; see the top of benches/bench/main.rs");
                std::process::exit(2);
            }
        }
    }
    options
}

fn find<'a>(rows: &'a [Row], scenario: &str, library: &str, metric: &str) -> Option<&'a Row> {
    rows.iter().find(|row| {
        row.scenario == scenario && row.library == library && row.metric.starts_with(metric)
    })
}

/// How a measured figure must compare with its bound.
#[derive(Clone, Copy)]
enum Bound {
    AtMost(f64),
    AtLeast(f64),
    Below(f64),
}

impl Bound {
    fn met(self, value: f64) -> bool {
        match self {
            Bound::AtMost(bound) => value <= bound,
            Bound::AtLeast(bound) => value >= bound,
            Bound::Below(bound) => value < bound,
        }
    }

    fn text(self, unit: &str) -> String {
        match self {
            Bound::AtMost(bound) => format!("<= {bound}{unit}"),
            Bound::AtLeast(bound) => format!(">= {bound}{unit}"),
            Bound::Below(bound) => format!("< {bound}{unit}"),
        }
    }
}

/// The targets of the performance issues (13, 45, 59), as (what, measured, target, met).
/// A target's figure is `None` when the run did not measure it (a scenario left out, or one
/// that could not run): shown as "not measured", never dropped.
fn targets(rows: &[Row], many: usize) -> Vec<(String, Option<f64>, String, Option<bool>)> {
    let median = |scenario: &str, library: &str, metric: &str| {
        find(rows, scenario, library, metric).map(Row::median)
    };
    let of = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let ping = median("3 wake-up", "PING round trip", "median");
    let p99 = find(rows, "3 wake-up", "fredlock", "unlock").map(|row| row.summary.p99);
    let calls = many as f64 / 100.0 + 1.0;
    let wanted: [(&str, Option<f64>, Bound, String); 26] = [
        (
            "1 uncontended: idle event receiver / none",
            median(
                "1 uncontended",
                "fredlock + idle event receiver / fredlock",
                "ratio",
            ),
            Bound::AtMost(1.02),
            String::new(),
        ),
        (
            "1 uncontended: fredlock / raw",
            median("1 uncontended", "fredlock / raw", "ratio"),
            Bound::AtMost(1.03),
            String::new(),
        ),
        (
            "1 uncontended: fredlock / rslock",
            of(
                median("1 uncontended", "fredlock", "lock+unlock"),
                median("1 uncontended", "rslock 0.10", "lock+unlock"),
            ),
            Bound::AtMost(1.0),
            String::new(),
        ),
        (
            "2 throughput: fredlock / raw",
            median("2 throughput", "fredlock / raw", "ratio"),
            Bound::AtLeast(0.97),
            String::new(),
        ),
        (
            "3 wake-up: median / PING median",
            median("3 wake-up", "fredlock / PING", "ratio"),
            Bound::AtMost(2.0),
            String::new(),
        ),
        (
            "3 wake-up: p99 / PING median",
            of(p99, ping),
            Bound::AtMost(5.0),
            String::new(),
        ),
        (
            "4 contention: fair / reentrant hand-offs",
            of(
                median("4 contention", "fredlock fair", "hand-offs"),
                median("4 contention", "fredlock", "hand-offs"),
            ),
            Bound::AtLeast(0.9),
            String::new(),
        ),
        (
            "5 watchdog: renewal calls per period",
            median("5 watchdog", "fredlock", "renewal"),
            Bound::AtMost(calls),
            " (locks/100 + 1 slot)".into(),
        ),
        (
            "5 watchdog: client CPU",
            median("5 watchdog", "fredlock", "client CPU"),
            Bound::Below(5.0),
            " % of a core".into(),
        ),
        (
            "6 memory: heap per held lock",
            median("6 memory", "fredlock", "heap per held"),
            Bound::AtMost(512.0),
            " bytes".into(),
        ),
        (
            "6 memory: heap per waiting task",
            median("6 memory", "fredlock", "heap per waiting"),
            Bound::AtMost(1024.0),
            " bytes".into(),
        ),
        (
            "7 redlock: fredlock RedLock / rslock",
            of(
                median("7 redlock (5 nodes)", "fredlock RedLock", "try_lock+unlock"),
                median("7 redlock (5 nodes)", "rslock 0.10", "lock+unlock"),
            ),
            Bound::Below(1.0),
            String::new(),
        ),
        (
            "8 instructions: fredlock / raw",
            median("8 instructions", "fredlock / raw", "ratio"),
            Bound::AtMost(1.05),
            String::new(),
        ),
        (
            "13 job lock: run of an empty job / rslock lock+unlock",
            median("13 job lock", "fredlock / rslock", "ratio"),
            Bound::AtMost(1.0),
            String::new(),
        ),
        (
            "8 instructions: fredlock / floor",
            median("8 instructions", "fredlock / floor", "ratio"),
            Bound::AtMost(1.12),
            String::new(),
        ),
        // Issue 45: the lock on redis-rs against the same client library.
        (
            "1 uncontended: fredlock on redis-rs / redis-rs EVALSHA x2",
            of(
                median("1 uncontended", "fredlock on redis-rs", "lock+unlock"),
                median("1 uncontended", "redis-rs EVALSHA x2", "acquire+release"),
            ),
            Bound::AtMost(1.05),
            String::new(),
        ),
        (
            "1 uncontended: fredlock on redis-rs / rslock",
            of(
                median("1 uncontended", "fredlock on redis-rs", "lock+unlock"),
                median("1 uncontended", "rslock 0.10", "lock+unlock"),
            ),
            Bound::AtMost(1.1),
            String::new(),
        ),
        (
            "8 instructions: fredlock on redis-rs / floor on redis-rs",
            median(
                "8 instructions",
                "fredlock on redis-rs / floor on redis-rs",
                "ratio",
            ),
            Bound::AtMost(1.12),
            String::new(),
        ),
        (
            "13 job lock: run on redis-rs / rslock lock+unlock",
            median("13 job lock", "fredlock on redis-rs / rslock", "ratio"),
            Bound::AtMost(1.0),
            String::new(),
        ),
        (
            "2 throughput: fredlock on redis-rs / raw on redis-rs",
            median(
                "2 throughput",
                "fredlock on redis-rs / raw on redis-rs",
                "ratio",
            ),
            Bound::AtLeast(0.9),
            String::new(),
        ),
        (
            "3 wake-up: fredlock on redis-rs median / PING median",
            median("3 wake-up", "fredlock on redis-rs / PING", "ratio"),
            Bound::AtMost(2.0),
            String::new(),
        ),
        (
            "6 memory: heap per held lock, on redis-rs / on fred",
            of(
                median("6 memory", "fredlock on redis-rs", "heap per held"),
                median("6 memory", "fredlock", "heap per held"),
            ),
            Bound::AtMost(1.0),
            String::new(),
        ),
        (
            "6 memory: heap per waiting task, on redis-rs / on fred",
            of(
                median("6 memory", "fredlock on redis-rs", "heap per waiting"),
                median("6 memory", "fredlock", "heap per waiting"),
            ),
            Bound::AtMost(1.0),
            String::new(),
        ),
        // Issue 59: no herd of waiting instances on the reentrant lock.
        (
            "14 growth: fredlock scripts per acquisition, 64 instances",
            median("14 growth (64 instances)", "fredlock", "scripts"),
            Bound::AtMost(4.0),
            String::new(),
        ),
        (
            "14 growth: fredlock acquisitions, 64 instances / 2",
            of(
                median("14 growth (64 instances)", "fredlock", "acquisitions"),
                median("14 growth (2 instances)", "fredlock", "acquisitions"),
            ),
            Bound::AtLeast(0.9),
            String::new(),
        ),
        (
            "14 growth: fredlock worst wait / fair lock's, 64 instances",
            of(
                median("14 growth (64 instances)", "fredlock", "worst wait"),
                median("14 growth (64 instances)", "fredlock fair", "worst wait"),
            ),
            Bound::AtMost(3.0),
            String::new(),
        ),
    ];
    wanted
        .into_iter()
        .map(|(what, value, bound, unit)| {
            let met = value.map(|value| bound.met(value));
            (what.to_string(), value, bound.text(&unit), met)
        })
        .collect()
}

fn table(rows: &[Row], checks: &[(String, Option<f64>, String, Option<bool>)]) -> String {
    let mut out = String::new();
    out.push_str("| scenario | library | metric | median | min | max | unit |\n");
    out.push_str("| --- | --- | --- | ---: | ---: | ---: | --- |\n");
    for row in rows {
        let s = row.summary;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            row.scenario,
            row.library,
            row.metric,
            fmt(s.median),
            fmt(s.min),
            fmt(s.max),
            row.unit
        ));
    }
    out.push_str("\n| target | measured | wanted | met |\n| --- | ---: | --- | --- |\n");
    for (what, value, target, met) in checks {
        out.push_str(&format!(
            "| {what} | {} | {target} | {} |\n",
            value.map_or_else(|| "not measured".to_string(), fmt),
            match met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "not measured",
            }
        ));
    }
    out
}

fn fmt(value: f64) -> String {
    match value.abs() {
        v if v.is_nan() => "-".into(),
        v if v >= 1000.0 => format!("{value:.0}"),
        v if v >= 10.0 => format!("{value:.1}"),
        v if v >= 1.0 => format!("{value:.2}"),
        _ => format!("{value:.3}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|arg| arg == instructions::CHILD_FLAG) {
        // A child of scenario 8, counted by callgrind: one thread, nothing else.
        let (subject, cycles, url) = match (args.get(at + 1), args.get(at + 2), args.get(at + 3)) {
            (Some(subject), Some(cycles), Some(url)) => (subject, cycles, url),
            _ => {
                eprintln!(
                    "usage: {} <subject> <cycles> <url>",
                    instructions::CHILD_FLAG
                );
                std::process::exit(2);
            }
        };
        let cycles = cycles.parse().unwrap_or(0);
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(instructions::child(subject, cycles, url)),
            Err(error) => eprintln!("no tokio runtime: {error}"),
        }
        return;
    }
    let options = options();
    let mut runtime = if options.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(run(options)),
        Err(error) => eprintln!("no tokio runtime: {error}"),
    }
}

async fn run(options: Options) {
    let mut sizes = if options.quick {
        scenarios::Sizes::quick()
    } else {
        scenarios::Sizes::full()
    };
    if let Some(locks) = options.locks {
        sizes.many = locks;
    }
    if let Some(seconds) = options.watchdog {
        sizes.watchdog = std::time::Duration::from_secs(seconds);
    }
    let wanted = |n: u8| options.only.as_ref().is_none_or(|only| only.contains(&n));
    let server = harness::RedisServer::start();
    let url = server.url();
    let machine = measure::machine();
    let flavor = if options.current_thread {
        "current-thread"
    } else {
        "multi-thread"
    };
    eprintln!("fredlock benchmark on {machine}, {flavor} runtime; redis-server at {url}");

    let mut rows = Vec::new();
    let mut charts_written = Vec::new();
    if let Some(dir) = options.chart.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if wanted(1) {
        eprintln!("1/18 uncontended latency");
        let (uncontended_rows, series) = scenarios::uncontended(&url, sizes).await;
        let raw = find(
            &uncontended_rows,
            "1 uncontended",
            "raw EVALSHA x2",
            "acquire",
        )
        .map_or(0.0, Row::median);
        rows.extend(uncontended_rows);
        let chart = chart::Chart {
            title: "Uncontended lock+unlock latency, one cycle at a time",
            unit: "microseconds",
            reference: (
                format!("raw EVALSHA x2, median of rounds ({raw:.1} µs)"),
                raw,
            ),
            floor: 10.0,
        };
        let path = options.chart.with_file_name("uncontended-latency.svg");
        match chart::cdf(&path, &chart, &series) {
            Ok(()) => charts_written.push(path.display().to_string()),
            Err(error) => eprintln!("chart not written: {error}"),
        }
    }
    if wanted(2) {
        eprintln!("2/18 throughput");
        rows.extend(scenarios::throughput(&url, sizes).await);
    }
    if wanted(3) {
        eprintln!("3/18 wake-up latency");
        let (wakeup_rows, series) = scenarios::wakeup(&url, sizes).await;
        let ping =
            find(&wakeup_rows, "3 wake-up", "PING round trip", "median").map_or(0.0, Row::median);
        rows.extend(wakeup_rows);
        let chart = chart::Chart {
            title: "Wake-up latency: holder's unlock returns -> blocked waiter holds the lock",
            unit: "milliseconds",
            reference: (format!("one PING round trip ({ping:.3} ms)"), ping),
            floor: 0.01,
        };
        match chart::cdf(&options.chart, &chart, &series) {
            Ok(()) => charts_written.push(options.chart.display().to_string()),
            Err(error) => eprintln!("chart not written: {error}"),
        }
    }
    if wanted(4) {
        eprintln!("4/18 contention");
        rows.extend(scenarios::contention(&url, sizes).await);
    }
    if wanted(5) {
        eprintln!("5/18 watchdog at scale");
        rows.extend(scenarios::watchdog(&url, sizes).await);
    }
    if wanted(6) {
        eprintln!("6/18 memory");
        rows.extend(scenarios::memory(&url, sizes).await);
    }
    if wanted(8) {
        eprintln!("8/18 instructions per cycle (callgrind)");
        rows.extend(instructions::instructions(&url));
    }
    if wanted(9) {
        eprintln!("9/18 waiters at scale");
        rows.extend(scenarios::waiters_at_scale(&url, sizes).await);
    }
    if wanted(10) {
        eprintln!("10/18 read-write lock");
        rows.extend(rw::rw_lock(&url, sizes).await);
    }
    if wanted(11) {
        eprintln!("11/18 semaphores");
        rows.extend(semaphore::semaphores(&url, sizes).await);
    }
    if wanted(12) {
        eprintln!("12/18 leader election");
        rows.extend(leader::leader_election(&url, sizes).await);
    }
    if wanted(13) {
        eprintln!("13/18 job lock");
        rows.extend(job::job_lock(&url, sizes).await);
    }
    if wanted(14) {
        eprintln!("14/18 growth: instances on one lock");
        rows.extend(scenarios::growth(&url, sizes).await);
    }
    if wanted(15) {
        eprintln!("15/18 growth: held locks");
        let held: &[usize] = if options.quick {
            &growth::HELD_QUICK
        } else {
            &growth::HELD
        };
        rows.extend(growth::held(&url, held).await);
    }
    if wanted(16) {
        eprintln!("16/18 growth: waiting tasks on many names");
        let waiters: &[(usize, usize)] = if options.quick {
            &growth::WAITERS_QUICK
        } else {
            &growth::WAITERS
        };
        rows.extend(growth::waiters(&url, waiters).await);
    }
    if wanted(18) {
        eprintln!("18/18 where an uncontended lock+unlock's time goes");
        rows.extend(breakdown::breakdown(&url, sizes).await);
    }
    drop(server);
    if wanted(17) {
        eprintln!("17/18 growth: a three-master cluster against one server");
        rows.extend(growth::cluster(sizes).await);
    }
    if wanted(7) {
        eprintln!("7/18 Redlock over five servers");
        rows.extend(redlock::redlock(sizes).await);
    }

    let checks = targets(&rows, sizes.many);
    let report = table(&rows, &checks);
    if options.json {
        eprintln!("{report}");
        let json = json!({
            "machine": machine,
            "runtime": if options.current_thread { "current-thread" } else { "multi-thread" },
            "quick": options.quick,
            "charts": charts_written,
            "rows": rows.iter().map(|row| json!({
                "scenario": row.scenario, "library": row.library, "metric": row.metric,
                "unit": row.unit, "summary": row.summary.json(),
            })).collect::<Vec<_>>(),
            "targets": checks.iter().map(|(what, value, target, met)| json!({
                "what": what, "measured": value, "wanted": target, "met": met,
            })).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&json).unwrap_or_default()
        );
    } else {
        println!("{report}");
        for chart in &charts_written {
            println!("chart: {chart}");
        }
    }
}
