//! The page: one HTML file, its script and its style sheet, embedded in
//! the binary (no CDN, nothing fetched at run time). The page uses only
//! the JSON API.

use crate::State;
use axum::extract::{Request, State as Shared};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use std::sync::Arc;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/style.css");

/// `GET /`: the page, its asset links carrying the token (hex: nothing to
/// escape).
pub async fn index(Shared(state): Shared<Arc<State>>) -> Html<String> {
    Html(INDEX.replace("__TOKEN__", &state.token))
}

/// `GET /app.js`.
pub async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
}

/// `GET /style.css`.
pub async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}

/// Middleware: headers of every answer. The page runs only its own
/// script and talks only to this server; no answer is cached (they hold
/// backup contents) and no link sends the URL (with its token) away.
pub async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        // A handler's own policy (a served report's) stays.
        h.entry(name).or_insert(HeaderValue::from_static(value));
    }
    response
}
