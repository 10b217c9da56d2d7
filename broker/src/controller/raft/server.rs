//! The server side of the controller protocol, bound to this node's CONTROLLER listener: accepts
//! peer connections and answers their requests one at a time per connection. Connection tasks
//! belong to the accept task, so aborting it (on shutdown) closes every connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::wire::{framed, recv, send, Envelope, Response};
use super::Inner;

/// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

pub(super) async fn serve(listener: TcpListener, inner: Arc<Inner>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tracing::trace!(%peer, "controller connection");
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(%peer, error = %e, "set_nodelay failed");
                    }
                    conns.spawn(connection(stream, inner.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a controller connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn connection(stream: tokio::net::TcpStream, inner: Arc<Inner>) {
    let mut frames = framed(stream);
    loop {
        let envelope = match recv::<Envelope>(&mut frames).await {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "dropping a controller connection");
                return;
            }
        };
        let response = if envelope.to == inner.id {
            inner.serve(envelope.request).await
        } else {
            tracing::warn!(
                to = envelope.to,
                me = inner.id,
                "a peer addressed a request to another node: check controller.quorum.voters"
            );
            Response::WrongNode { id: inner.id }
        };
        if let Err(e) = send(&mut frames, &response).await {
            tracing::debug!(error = %e, "answering a controller request failed");
            return;
        }
    }
}
