//! Clocks and sleepers that never wait for real.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::{Clock, Sleeper};

#[derive(Debug, Default)]
struct VirtualState {
    now: i64,
    sleeps: Vec<Duration>,
}

/// A clock and a sleeper sharing virtual time: a sleep advances the clock
/// at once and is recorded. Clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct VirtualClock {
    state: Arc<Mutex<VirtualState>>,
}

impl VirtualClock {
    /// Virtual time starting at `now` (epoch seconds).
    pub fn at(now: i64) -> Self {
        Self {
            state: Arc::new(Mutex::new(VirtualState {
                now,
                sleeps: Vec::new(),
            })),
        }
    }

    /// Moves time forward by `seconds`.
    pub fn advance(&self, seconds: i64) {
        self.state.lock().unwrap().now += seconds;
    }

    /// Sets the time.
    pub fn set(&self, now: i64) {
        self.state.lock().unwrap().now = now;
    }

    /// Every sleep so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        self.state.lock().unwrap().sleeps.clone()
    }

    /// Every sleep so far, in whole seconds.
    pub fn sleep_seconds(&self) -> Vec<u64> {
        self.sleeps().iter().map(Duration::as_secs).collect()
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> i64 {
        self.state.lock().unwrap().now
    }
}

#[async_trait]
impl Sleeper for VirtualClock {
    async fn sleep(&self, duration: Duration) {
        let mut state = self.state.lock().unwrap();
        state.now += i64::try_from(duration.as_secs()).unwrap_or(i64::MAX);
        state.sleeps.push(duration);
    }
}

/// A clock that replays a scripted sequence of readings; the last repeats.
#[derive(Clone, Debug)]
pub struct ScriptedClock {
    readings: Arc<Mutex<(Vec<i64>, usize)>>,
}

impl ScriptedClock {
    /// Replays `readings` in order.
    pub fn new(readings: impl Into<Vec<i64>>) -> Self {
        let readings = readings.into();
        assert!(
            !readings.is_empty(),
            "a scripted clock needs at least one reading"
        );
        Self {
            readings: Arc::new(Mutex::new((readings, 0))),
        }
    }

    /// How many times the clock was read.
    pub fn reads(&self) -> usize {
        self.readings.lock().unwrap().1
    }
}

impl Clock for ScriptedClock {
    fn now(&self) -> i64 {
        let mut guard = self.readings.lock().unwrap();
        let (readings, reads) = &mut *guard;
        let reading = readings[(*reads).min(readings.len() - 1)];
        *reads += 1;
        reading
    }
}
