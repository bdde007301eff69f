//! Clocks and sleepers that never wait for real.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::{Clock, Sleeper};

#[derive(Debug, Default)]
struct VirtualState {
    /// Wall-clock time in milliseconds since the epoch.
    wall_ms: i64,
    /// Monotonic time in milliseconds: moves with time passing, never with
    /// a wall-clock jump.
    mono_ms: u64,
    sleeps: Vec<Duration>,
}

impl VirtualState {
    fn pass(&mut self, ms: u64) {
        self.wall_ms = self
            .wall_ms
            .saturating_add(i64::try_from(ms).unwrap_or(i64::MAX));
        self.mono_ms = self.mono_ms.saturating_add(ms);
    }
}

/// A clock and a sleeper sharing virtual time: a sleep advances the clock
/// at once and is recorded. Clones share the same time. The wall clock and
/// the monotonic clock move together, except for [`VirtualClock::jump`].
#[derive(Clone, Debug, Default)]
pub struct VirtualClock {
    state: Arc<Mutex<VirtualState>>,
}

impl VirtualClock {
    /// Virtual time starting at `now` (epoch seconds).
    pub fn at(now: i64) -> Self {
        Self {
            state: Arc::new(Mutex::new(VirtualState {
                wall_ms: now.saturating_mul(1000),
                mono_ms: 0,
                sleeps: Vec::new(),
            })),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, VirtualState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Lets `seconds` pass.
    pub fn advance(&self, seconds: i64) {
        self.advance_millis(
            u64::try_from(seconds.max(0))
                .unwrap_or(0)
                .saturating_mul(1000),
        );
    }

    /// Lets `ms` milliseconds pass.
    pub fn advance_millis(&self, ms: u64) {
        self.state().pass(ms);
    }

    /// Lets time pass until the wall clock reads `now` (never backwards).
    pub fn set(&self, now: i64) {
        let mut state = self.state();
        let ms = now.saturating_mul(1000).saturating_sub(state.wall_ms);
        state.pass(u64::try_from(ms).unwrap_or(0));
    }

    /// Moves the wall clock by `seconds` without any time passing: a clock
    /// jump (NTP, a suspended VM) that a monotonic clock does not see.
    pub fn jump(&self, seconds: i64) {
        let mut state = self.state();
        state.wall_ms = state.wall_ms.saturating_add(seconds.saturating_mul(1000));
    }

    /// Every sleep so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        self.state().sleeps.clone()
    }

    /// Every sleep so far, in whole seconds.
    pub fn sleep_seconds(&self) -> Vec<u64> {
        self.sleeps().iter().map(Duration::as_secs).collect()
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> i64 {
        self.state().wall_ms.div_euclid(1000)
    }

    fn monotonic_millis(&self) -> u64 {
        self.state().mono_ms
    }
}

#[async_trait]
impl Sleeper for VirtualClock {
    async fn sleep(&self, duration: Duration) {
        let mut state = self.state();
        state.pass(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
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
