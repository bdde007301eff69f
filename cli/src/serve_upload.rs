//! Uploads to the web board: a file attached to a card through the same
//! store `kanban attach` uses, copied to disk as it arrives.

use std::path::{Path, PathBuf};

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::serve::{App, Failure};

/// An upload's name and type, in its URL (its body is the file).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UploadQuery {
    name: String,
    /// The file's content type; none: guessed from its name.
    #[serde(rename = "type")]
    content_type: Option<String>,
}

/// Attaches the request's body to a card, as `kanban attach` does: sent as
/// `application/octet-stream` (a type no form of another site can send),
/// copied to disk as it arrives (never held whole), 25 MiB at most.
pub(crate) async fn api_upload(
    State(app): State<std::sync::Arc<App>>,
    UrlPath(id): UrlPath<String>,
    query: Result<Query<UploadQuery>, QueryRejection>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<(StatusCode, Json<Value>), Failure> {
    let query = crate::serve::query_of(query)?;
    let octets = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/octet-stream")
        });
    if !octets {
        return Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the file as the body, with Content-Type: application/octet-stream (its own type goes in ?type=)",
        ));
    }
    if !kanban_core::is_valid_task_id(&id) {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no card {id:?}"),
        ));
    }
    app.board.show_task(&id).await?;
    // The name and the type are checked before a byte is received: what
    // the store refuses after that is the disk's doing (500).
    kanban_core::attachments::safe_attachment_name(&query.name)
        .map_err(|problem| Failure::new(StatusCode::BAD_REQUEST, problem))?;
    if let Some(given) = &query.content_type {
        kanban_agent_port::checked_content_type(given)
            .map_err(|problem| Failure::new(StatusCode::BAD_REQUEST, problem))?;
    }
    let root = app.attachments.clone();
    let partial = receive(&root, body).await?;
    let (task, name, kind) = (id.clone(), query.name, query.content_type);
    let stored = tokio::task::spawn_blocking(move || {
        let stored = std::fs::File::open(&partial)
            .map_err(|error| format!("cannot read the upload: {error}"))
            .and_then(|mut source| {
                kanban_agent_port::store_attachment_from(
                    &root,
                    &task,
                    &name,
                    &mut source,
                    kind.as_deref(),
                    "web",
                )
            });
        let _ = std::fs::remove_file(&partial);
        stored
    })
    .await
    .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))?
    .map_err(|problem| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, problem))?;
    match app.board.add_attachment(&id, &stored).await {
        Ok(number) => Ok((
            StatusCode::CREATED,
            Json(json!({"id": number, "filename": stored.filename, "size": stored.size})),
        )),
        Err(error) => {
            kanban_agent_port::discard_attachment(&stored);
            Err(error.into())
        }
    }
}

/// Writes the body beside the board's files as it arrives, at most 25
/// MiB: the path of what was written (removed again on any failure).
async fn receive(root: &Path, body: axum::body::Body) -> Result<PathBuf, Failure> {
    use futures_util::StreamExt as _;
    use tokio::io::AsyncWriteExt as _;
    let fault = |error: std::io::Error| {
        Failure::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "cannot write the upload under {}: {error}; make it writable or set HERMES_KANBAN_ATTACHMENTS_ROOT",
                root.display()
            ),
        )
    };
    tokio::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .await
        .map_err(fault)?;
    let partial = root.join(format!(".upload-{}", crate::supervisor::random_hex()));
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .await
        .map_err(fault)?;
    let limit = kanban_core::attachments::MAX_ATTACHMENT_BYTES;
    let mut size: u64 = 0;
    let mut chunks = body.into_data_stream();
    let written: Result<(), Failure> = async {
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|error| {
                Failure::new(
                    StatusCode::BAD_REQUEST,
                    format!("the upload broke off: {error}"),
                )
            })?;
            size += chunk.len() as u64;
            if size > limit {
                return Err(Failure::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a card takes files of at most {} MiB", limit / 1024 / 1024),
                ));
            }
            file.write_all(&chunk).await.map_err(fault)?;
        }
        file.flush().await.map_err(fault)
    }
    .await;
    drop(file);
    match written {
        Ok(()) => Ok(partial),
        Err(failure) => {
            let _ = tokio::fs::remove_file(&partial).await;
            Err(failure)
        }
    }
}
