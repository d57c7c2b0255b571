//! The one place that retries. Wraps the `backoff` crate (unmaintained, RUSTSEC-2025-0012, kept
//! because the project chose it) so nothing else depends on its API. Every policy has an explicit
//! `max_elapsed`: backoff's own default silently gives up after 15 minutes, which would hide a
//! hung pass; here the caller always says how long a retry loop may take.

use std::future::Future;
use std::time::{Duration, Instant};

use backoff::ExponentialBackoff;
use backoff::backoff::Backoff;

/// How long to wait between tries and when to give up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max_interval: Duration,
    /// Total time, tries and waits together, after which the last error is returned.
    pub max_elapsed: Duration,
}

impl RetryPolicy {
    /// Defaults for one Coder API call inside a pass: the pass must not hang on one request.
    pub fn for_api_calls() -> Self {
        RetryPolicy { initial: Duration::from_millis(200), max_interval: Duration::from_secs(5), max_elapsed: Duration::from_secs(20) }
    }

    /// A policy that never waits and gives up after the first failure.
    pub fn none() -> Self {
        RetryPolicy { initial: Duration::ZERO, max_interval: Duration::ZERO, max_elapsed: Duration::ZERO }
    }

    fn backoff(&self) -> ExponentialBackoff {
        ExponentialBackoff {
            initial_interval: self.initial,
            current_interval: self.initial,
            max_interval: self.max_interval,
            max_elapsed_time: Some(self.max_elapsed),
            multiplier: 2.0,
            randomization_factor: 0.5,
            ..ExponentialBackoff::default()
        }
    }

    /// The delay before retry number `attempt` (1-based) of a slow, pass-to-pass retry such as a
    /// failed stop build: exponential, capped at `max_interval`, no jitter (deterministic for tests).
    pub fn delay_for_attempt(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(16));
        self.initial.saturating_mul(factor).min(self.max_interval)
    }
}

/// What one try says about itself.
pub enum Attempt<T, E> {
    /// Final: success, or an error that must not be retried.
    Done(Result<T, E>),
    /// Worth another try; `after` is the server's `Retry-After`, if it sent one.
    Retry { error: E, after: Option<Duration> },
}

/// Runs `op` until it is done or the policy's time is spent. A server's `Retry-After` is honoured
/// (the wait is the longer of it and the backoff), but never beyond `max_elapsed`.
pub async fn retry<T, E, F, Fut>(policy: RetryPolicy, mut op: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Attempt<T, E>>,
{
    let started = Instant::now();
    let mut backoff = policy.backoff();
    loop {
        match op().await {
            Attempt::Done(result) => return result,
            Attempt::Retry { error, after } => {
                let Some(next) = backoff.next_backoff() else { return Err(error) };
                let wait = after.map_or(next, |after| after.max(next));
                if started.elapsed().saturating_add(wait) > policy.max_elapsed {
                    return Err(error);
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn quick() -> RetryPolicy {
        RetryPolicy { initial: Duration::from_millis(1), max_interval: Duration::from_millis(4), max_elapsed: Duration::from_millis(500) }
    }

    #[tokio::test]
    async fn retries_until_success() {
        let tries = Cell::new(0);
        let out: Result<u32, &str> = retry(quick(), || {
            tries.set(tries.get() + 1);
            let n = tries.get();
            async move { if n < 3 { Attempt::Retry { error: "busy", after: None } } else { Attempt::Done(Ok(n)) } }
        })
        .await;
        assert_eq!(out, Ok(3));
    }

    #[tokio::test]
    async fn a_final_error_is_not_retried() {
        let tries = Cell::new(0);
        let out: Result<(), &str> = retry(quick(), || {
            tries.set(tries.get() + 1);
            async { Attempt::Done(Err("forbidden")) }
        })
        .await;
        assert_eq!(out, Err("forbidden"));
        assert_eq!(tries.get(), 1);
    }

    #[tokio::test]
    async fn gives_up_when_retry_after_exceeds_the_budget() {
        let started = Instant::now();
        let out: Result<(), &str> =
            retry(quick(), || async { Attempt::Retry { error: "limited", after: Some(Duration::from_secs(60)) } }).await;
        assert_eq!(out, Err("limited"));
        assert!(started.elapsed() < Duration::from_secs(5), "must not sleep a 60 s Retry-After past the budget");
    }

    #[test]
    fn pass_to_pass_delays_grow_and_are_capped() {
        let p = RetryPolicy { initial: Duration::from_secs(60), max_interval: Duration::from_secs(600), max_elapsed: Duration::ZERO };
        let got: Vec<u64> = (1..=6).map(|a| p.delay_for_attempt(a).as_secs()).collect();
        assert_eq!(got, vec![60, 120, 240, 480, 600, 600]);
    }
}
