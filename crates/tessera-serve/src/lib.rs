//! `tessera serve`: a web interface over one repository. An HTTP server
//! (axum) bound to loopback by default, every request authenticated by a
//! random token ([`auth`]), a JSON API over the engine's read-only
//! operations ([`api`], documented in docs/API.md) and one page (HTML, JS,
//! CSS) embedded in the binary ([`page`]).
//!
//! The repository is opened once by the caller (with a shared read lock,
//! held while the server runs); the engine's calls block, so each request
//! runs them on tokio's blocking pool. Requests share the handle under a
//! read guard; deleting backups (`POST /api/forget`) takes it alone,
//! relocked for exclusive access for the time of the deletion.

use axum::routing::get;
use axum::Router;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use tessera::Repository;

pub mod act;
pub mod api;
pub mod auth;
pub mod page;
pub mod reports;

/// Why the server did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Listening on this address is refused (it is not loopback).
    #[error("{addr}: not a loopback address: the server has no TLS, so its token and your backups' contents would cross the network in clear; pass --insecure to listen there anyway (e.g. behind a TLS proxy or on a trusted network)")]
    NotLoopback {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// Binding, or serving, failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The random token could not be drawn.
    #[error("drawing the access token from the system's random source: {0}")]
    Random(String),
}

/// How the server runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where to listen (port 0: a free port).
    pub listen: SocketAddr,
    /// Refuse the endpoints that act (restore, check, forget).
    pub read_only: bool,
    /// Allow a non-loopback `listen`.
    pub insecure: bool,
    /// Where the last check's record is kept (the per-user cache root,
    /// `tessera::backend::cache_root()`; FORMAT.md §13.4): read for the
    /// health view, written by `POST /api/check`. `None`: no record is
    /// read or kept.
    pub last_check_dir: Option<PathBuf>,
    /// The directory of the lab's experiment reports (`GET /api/reports`),
    /// if any.
    pub reports: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            read_only: true,
            insecure: false,
            last_check_dir: None,
            reports: None,
        }
    }
}

/// What every handler shares: the open repository and the token.
pub struct State {
    /// The repository, opened for reading: each request holds a read
    /// guard while it uses it; a deletion holds the write guard.
    pub repo: Arc<tokio::sync::RwLock<Repository>>,
    /// The access token (hex).
    pub token: String,
    /// Whether write endpoints are refused.
    pub read_only: bool,
    /// Where the last check's record is kept ([`Options::last_check_dir`]).
    pub last_check_dir: Option<PathBuf>,
    /// The directory of the experiment reports ([`Options::reports`]).
    pub reports: Option<PathBuf>,
}

/// A bound server, not yet serving: its address and token are known.
pub struct Server {
    listener: TcpListener,
    state: Arc<State>,
    addr: SocketAddr,
}

impl Server {
    /// Binds `options.listen` (refusing a non-loopback address unless
    /// `options.insecure`) and draws a token.
    pub fn bind(repo: Repository, options: &Options) -> Result<Server, Error> {
        if !options.listen.ip().is_loopback() && !options.insecure {
            return Err(Error::NotLoopback {
                addr: options.listen,
            });
        }
        let io = |what: &str| {
            let what = what.to_string();
            move |source| Error::Io { what, source }
        };
        let listen = options.listen;
        let listener = TcpListener::bind(listen).map_err(io(&format!("listening on {listen}")))?;
        let addr = listener.local_addr().map_err(io("the bound address"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("a non-blocking socket"))?;
        let state = Arc::new(State {
            repo: Arc::new(tokio::sync::RwLock::new(repo)),
            token: auth::new_token().map_err(|e| Error::Random(e.to_string()))?,
            read_only: options.read_only,
            last_check_dir: options.last_check_dir.clone(),
            reports: options.reports.clone(),
        });
        Ok(Server {
            listener,
            state,
            addr,
        })
    }

    /// The address listened on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The access token.
    pub fn token(&self) -> &str {
        &self.state.token
    }

    /// The URL to open: the page, with the token.
    pub fn url(&self) -> String {
        format!("http://{}/?token={}", self.addr, self.state.token)
    }

    /// Serves until the process ends (or the runtime fails), on a tokio
    /// runtime of its own.
    pub fn run(self) -> Result<(), Error> {
        self.run_until(std::future::pending())
    }

    /// Serves until `stop` completes, then stops taking connections, lets
    /// the requests under way finish and returns; the repository (and its
    /// lock) is released when the last request lets go of it.
    pub fn run_until(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|source| Error::Io {
                what: "starting the async runtime".into(),
                source,
            })?;
        runtime.block_on(async move {
            let listener =
                tokio::net::TcpListener::from_std(self.listener).map_err(|source| Error::Io {
                    what: "registering the socket".into(),
                    source,
                })?;
            axum::serve(listener, router(self.state))
                .with_graceful_shutdown(stop)
                .await
                .map_err(|source| Error::Io {
                    what: "serving".into(),
                    source,
                })
        })
    }
}

/// The routes: the page and its assets, then the API; all behind the token.
pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(page::index))
        .route("/app.js", get(page::script))
        .route("/style.css", get(page::style))
        .merge(api::routes())
        .merge(act::routes())
        .merge(reports::routes())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .layer(axum::middleware::from_fn(page::security_headers))
        .with_state(state)
}

/// Completes on the first SIGINT (Ctrl-C) or SIGTERM.
pub async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        // No signal handling: serve until killed.
        _ => std::future::pending().await,
    }
}

/// `tessera serve`: binds, prints the URL as the first line of standard
/// output, then serves until interrupted (Ctrl-C, SIGTERM), when it lets
/// the requests under way finish, releases the repository and says so on
/// standard error.
pub fn serve(repo: Repository, options: &Options) -> Result<(), Error> {
    use std::io::Write;
    let server = Server::bind(repo, options)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", server.url())
        .and_then(|()| out.flush())
        .map_err(|source| Error::Io {
            what: "standard output".into(),
            source,
        })?;
    drop(out);
    let addr = server.addr();
    server.run_until(async move {
        interrupted().await;
        eprintln!("tessera: serve: stopping (interrupted): finishing the requests under way");
    })?;
    eprintln!("tessera: serve: stopped listening on {addr}; repository released");
    Ok(())
}
