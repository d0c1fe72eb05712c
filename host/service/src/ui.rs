//! The web UI: static pages served by `eddy serve` at `/`, talking to the same REST API with
//! the token the user signs in with.
//!
//! The assets are compiled into the binary (no build step, nothing fetched at run time), so
//! the UI is always the one that matches the server's API.

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderName, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::AppState;

const INDEX: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const STYLE_CSS: &str = include_str!("../ui/style.css");
const FAVICON: &str = include_str!("../ui/favicon.svg");

/// Everything comes from this origin and nothing else: the page holds a bearer token, so no
/// inline script or third-party code may run next to it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
    connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// An embedded asset. `no-cache` makes browsers revalidate, so a new server version's UI
/// never runs against a cached old script.
fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    let headers: [(HeaderName, &'static str); 4] = [
        (header::CONTENT_TYPE, content_type),
        (header::CACHE_CONTROL, "no-cache"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CONTENT_SECURITY_POLICY, CSP),
    ];
    (headers, body)
}

async fn index() -> impl IntoResponse {
    asset("text/html; charset=utf-8", INDEX)
}

async fn app_js() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> impl IntoResponse {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

async fn favicon() -> impl IntoResponse {
    asset("image/svg+xml", FAVICON)
}

/// The UI's routes (outside `/v1`, so they are not part of the API document).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(index))
        .route("/ui/app.js", get(app_js))
        .route("/ui/style.css", get(style_css))
        .route("/ui/favicon.svg", get(favicon))
}
