//! A WebSocket ticker shared by the `websocket` example and `tests/websocket.rs`: the server
//! sends a numbered text message every `every` and, when the drain says streams should end,
//! a Close frame with code 1001 ("going away"); the client follows the ticks and tells a clean
//! close from a cut connection.
// Each user takes a different subset.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use lameduck::{Drain, InFlightGuard, StreamStop};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message as ClientMessage;

/// The close code a draining server sends: 1001, "going away".
pub(crate) const GOING_AWAY: u16 = 1001;

#[derive(Clone)]
struct Ctx {
    drain: Drain,
    every: Duration,
    spread: Duration,
}

/// `GET /ws`: a WebSocket ticking every `every`; sockets end spread over `spread` after
/// `stopped_accepting`.
pub(crate) fn router(drain: &Drain, every: Duration, spread: Duration) -> Router {
    Router::new().route("/ws", get(upgrade)).with_state(Ctx {
        drain: drain.clone(),
        every,
        spread,
    })
}

async fn upgrade(State(ctx): State<Ctx>, ws: WebSocketUpgrade) -> Response {
    // The upgrade request's own guard ends with its `101` response; the socket then lives in
    // a task of its own. Holding a guard there keeps it counted as in flight, so the drain
    // waits for the Close handshake instead of exiting under it.
    let guard = ctx.drain.enter();
    let stop = StreamStop::new(&ctx.drain).spread(ctx.spread);
    ws.on_upgrade(move |socket| session(socket, ctx.every, stop, guard))
}

async fn session(mut socket: WebSocket, every: Duration, stop: StreamStop, _guard: InFlightGuard) {
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(every);
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            () = &mut stop => {
                let frame = CloseFrame { code: GOING_AWAY, reason: "draining; reconnect".into() };
                if socket.send(Message::Close(Some(frame))).await.is_ok() {
                    // Wait (bounded) for the client's Close reply, completing the handshake.
                    let _ = tokio::time::timeout(Duration::from_secs(2), async {
                        while let Some(Ok(m)) = socket.recv().await {
                            if matches!(m, Message::Close(_)) {
                                break;
                            }
                        }
                    })
                    .await;
                }
                return;
            }
            _ = tick.tick() => {
                n += 1;
                if socket.send(Message::Text(n.to_string().into())).await.is_err() {
                    return;
                }
            }
            msg = socket.recv() => match msg {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

/// How a client's session on one server ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The server sent a Close frame with this code.
    Closed(u16),
    /// The connection ended without a Close frame (reset, EOF, protocol error).
    Cut(String),
    /// The client stopped after receiving enough ticks.
    Enough,
}

/// One WebSocket session from a client's point of view.
#[derive(Debug)]
pub(crate) struct Session {
    /// Which server it was on.
    pub(crate) server: SocketAddr,
    /// Ticks received.
    pub(crate) ticks: u64,
    /// How it ended.
    pub(crate) end: End,
}

/// Connects to `server`, reads ticks until the server closes, the connection is cut, or
/// `enough` ticks arrived.
pub(crate) async fn follow(server: SocketAddr, enough: u64) -> std::io::Result<Session> {
    let tcp = TcpStream::connect(server).await?;
    let url = format!("ws://{server}/ws");
    let (mut ws, _) = tokio_tungstenite::client_async(url, tcp)
        .await
        .map_err(std::io::Error::other)?;
    let mut ticks = 0;
    let end = loop {
        match ws.next().await {
            Some(Ok(ClientMessage::Text(_))) => {
                ticks += 1;
                if ticks >= enough {
                    let _ = ws.close(None).await;
                    break End::Enough;
                }
            }
            Some(Ok(ClientMessage::Close(frame))) => {
                let code = frame.map_or(CloseCode::Status, |f| f.code);
                // Reply to complete the handshake; the server then ends the socket.
                let _ = ws.close(None).await;
                break End::Closed(u16::from(code));
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => break End::Cut(e.to_string()),
            None => break End::Cut("connection ended without a Close frame".into()),
        }
    };
    Ok(Session { server, ticks, end })
}
