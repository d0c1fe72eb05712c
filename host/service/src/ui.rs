//! The web UI: static pages served by `eddy serve` at `/`, talking to the same REST API with
//! the token the user signs in with.

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::AppState;

const INDEX: &str = include_str!("../ui/index.html");

async fn index() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX)
}

/// The UI's routes (outside `/v1`, so they are not part of the API document).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/", get(index))
}
