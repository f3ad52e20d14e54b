//! The access token: drawn from the operating system's random source
//! (32 bytes, shown as hex), required by every request as
//! `Authorization: Bearer TOKEN` or the `token` query parameter, and
//! compared in constant time.

use crate::State;
use axum::extract::{Request, State as Shared};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// A new random token: 32 bytes from the OS's CSPRNG, as 64 hex digits.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// The token a request carries: the bearer token of its `Authorization`
/// header, else its `token` query parameter.
fn presented(request: &Request) -> Option<&str> {
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    bearer.or_else(|| {
        request
            .uri()
            .query()?
            .split('&')
            .find_map(|pair| pair.strip_prefix("token="))
    })
}

/// Whether `given` is the token (constant time in its bytes; the length
/// of the token is no secret).
pub fn matches(given: &str, token: &str) -> bool {
    given.as_bytes().ct_eq(token.as_bytes()).into()
}

/// Middleware: 401 unless the request carries the token.
pub async fn require_token(
    Shared(state): Shared<Arc<State>>,
    request: Request,
    next: Next,
) -> Response {
    match presented(&request) {
        Some(given) if matches(given, &state.token) => next.run(request).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            axum::Json(serde_json::json!({
                "error": "missing or wrong access token: open the URL `tessera serve` printed (with ?token=…), or send `Authorization: Bearer TOKEN`"
            })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_64_hex_digits_and_differ() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn only_the_exact_token_matches() {
        let t = new_token().unwrap();
        assert!(matches(&t, &t));
        assert!(!matches(&t[..63], &t));
        assert!(!matches("", &t));
        assert!(!matches(&format!("{t}0"), &t));
    }
}
