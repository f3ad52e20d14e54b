//! Bandwidth limits (`--limit-upload`, `--limit-download`): a token bucket
//! that makes callers wait so that the bytes passed stay within a rate.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A shared bandwidth limit: [`Throttle::pass`] blocks the caller until
/// its bytes fit the rate.
pub(crate) struct Throttle {
    rate: f64,
    bucket: Mutex<Bucket>,
}

/// The tokens (bytes) a limit has in hand at an instant; negative when
/// callers have been let through ahead of the rate and the next ones must
/// wait for it to catch up.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket at `now`.
    fn new(burst: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            at: now,
        }
    }

    /// Takes `bytes` at `now` from a bucket refilled at `rate` bytes per
    /// second up to `burst`: how long the caller must wait before sending.
    fn take(&mut self, rate: f64, burst: f64, bytes: u64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.at = self.at.max(now);
        self.tokens -= bytes as f64;
        match self.tokens < 0.0 {
            true => Duration::from_secs_f64(-self.tokens / rate),
            false => Duration::ZERO,
        }
    }
}

/// Bytes that may pass at once after an idle spell: a quarter second's worth.
fn burst(rate: f64) -> f64 {
    rate / 4.0
}

impl Throttle {
    /// A limit of `rate` bytes per second; `None` for 0 (no limit).
    pub(crate) fn new(rate: u64) -> Option<Throttle> {
        (rate > 0).then(|| Throttle {
            rate: rate as f64,
            bucket: Mutex::new(Bucket::new(burst(rate as f64), Instant::now())),
        })
    }

    /// Waits until `bytes` more may pass.
    pub(crate) fn pass(&self, bytes: u64) {
        let wait = {
            let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
            b.take(self.rate, burst(self.rate), bytes, Instant::now())
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Objects of varied sizes sent one after another, each when the
    /// bucket lets it (simulated time, no sleeping): the bytes sent by
    /// any instant never exceed the burst plus the rate times the time,
    /// and a long run averages the rate.
    #[test]
    fn transfers_keep_to_the_rate() {
        let rate = 100_000.0;
        let start = Instant::now();
        let mut bucket = Bucket::new(burst(rate), start);
        let mut now = start;
        let mut sent = 0u64;
        for i in 0..500u64 {
            let bytes = 1_000 + (i * 7919) % 60_000;
            let wait = bucket.take(rate, burst(rate), bytes, now);
            now += wait;
            // The transfer starts now: everything so far is within the rate.
            sent += bytes;
            let elapsed = (now - start).as_secs_f64();
            assert!(
                sent as f64 <= burst(rate) + rate * elapsed + bytes as f64,
                "{sent} bytes by {elapsed} s"
            );
        }
        let elapsed = (now - start).as_secs_f64();
        let average = sent as f64 / elapsed;
        assert!(
            (0.9 * rate..=1.1 * rate).contains(&average),
            "{average} B/s"
        );
    }

    /// An idle spell refills the bucket only up to the burst.
    #[test]
    fn idle_time_saves_only_a_burst() {
        let rate = 1_000.0;
        let start = Instant::now();
        let mut bucket = Bucket::new(burst(rate), start);
        let later = start + Duration::from_secs(3600);
        assert_eq!(bucket.take(rate, burst(rate), 250, later), Duration::ZERO);
        let wait = bucket.take(rate, burst(rate), 1_000, later);
        assert_eq!(wait, Duration::from_secs(1));
    }

    #[test]
    fn no_rate_is_no_limit() {
        assert!(Throttle::new(0).is_none());
        assert!(Throttle::new(1).is_some());
    }
}
