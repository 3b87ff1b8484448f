//! Statistics and the process's own accounting: live heap bytes, resident memory, CPU time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::Duration;

use serde_json::{json, Value};

/// Median, extremes and tail of a set of samples.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub p99: f64,
    pub samples: usize,
}

impl Summary {
    pub fn of(samples: &[f64]) -> Summary {
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        if sorted.is_empty() {
            return Summary {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                p99: f64::NAN,
                samples: 0,
            };
        }
        Summary {
            median: percentile(&sorted, 0.5),
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            p99: percentile(&sorted, 0.99),
            samples: sorted.len(),
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "median": self.median, "min": self.min, "max": self.max,
            "p99": self.p99, "samples": self.samples,
        })
    }
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Counts live heap bytes while switched on ([`count_heap`]), so that memory per lock is
/// measured exactly rather than read off the allocator's page-granular resident set. Off, it
/// costs a load of a flag nobody writes: the latency scenarios are not skewed by a contended
/// counter.
pub struct CountingAlloc;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Starts or stops counting. Blocks freed while counting is off are not subtracted, so compare
/// only figures taken within one stretch of counting.
pub fn count_heap(on: bool) {
    COUNTING.store(on, Ordering::SeqCst);
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        new
    }
}

/// Bytes currently allocated on the heap by this process.
pub fn live_heap_bytes() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Resident set size, from /proc/self/statm (Linux; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// User plus system CPU time of this process, from /proc/self/stat (Linux; zero elsewhere).
pub fn cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// Lines of /proc/cpuinfo and /proc/meminfo that say what machine this is.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let kb: u64 = info
                .lines()
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(format!("{:.0} GiB", kb as f64 / 1024.0 / 1024.0))
        })
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, {memory}")
}
