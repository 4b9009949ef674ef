//! A test-only tower layer that counts every request a `kube::Client` sends, by
//! [`RequestKey`], for the request-budget test: the client under test is built with the
//! layer outermost, so each call of the service is one request on the wire (kube-client's
//! own retry layer sits inside it and retries only on 429/503/504, which a test cluster
//! does not answer).

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use super::requests::{RequestKey, Tally};

/// Shared counts of the requests of every client built by [`RequestCounter::client`].
#[derive(Clone)]
pub struct RequestCounter(Arc<Mutex<Counts>>);

struct Counts {
    tally: Tally,
    last: Instant,
}

impl Default for RequestCounter {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Counts {
            tally: Tally::default(),
            last: Instant::now(),
        })))
    }
}

impl RequestCounter {
    /// A client for `config` whose every request is counted here.
    ///
    /// # Panics
    /// If kube cannot build a client for `config`, or outside a tokio runtime.
    pub fn client(&self, config: kube::Config) -> kube::Client {
        let counter = self.clone();
        capn::client::builder(config)
            .unwrap_or_else(|e| panic!("cannot build a client for the test cluster: {e}"))
            .with_layer(&tower::layer::layer_fn(move |inner| Counting {
                inner,
                counter: counter.clone(),
            }))
            .build()
    }

    /// The requests counted so far.
    pub fn tally(&self) -> Tally {
        self.lock().tally.clone()
    }

    /// How long ago the last request was sent (or the counter was made).
    pub fn idle_for(&self) -> std::time::Duration {
        self.lock().last.elapsed()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, key: RequestKey) {
        let mut counts = self.lock();
        counts.tally.add(key);
        counts.last = Instant::now();
    }
}

/// The service [`RequestCounter::client`] wraps around kube-client's stack.
#[derive(Clone)]
struct Counting<S> {
    inner: S,
    counter: RequestCounter,
}

impl<S, B> tower::Service<http::Request<B>> for Counting<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.counter
            .record(RequestKey::from_http(request.method(), request.uri()));
        self.inner.call(request)
    }
}
