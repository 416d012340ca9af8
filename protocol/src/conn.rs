//! Client and server halves of one arbiter connection: framed messages plus the grant page fd
//! that travels with a `Granted` reply as `SCM_RIGHTS` ancillary data.
//!
//! Owns: connecting with a timeout-free blocking stream, sending a reply with an fd, receiving a
//! reply and the fd that came with it, reading the peer's credentials. Must never: trust a pid
//! sent in a message (use [`peer_cred`]), or leak a received fd (it is returned as `OwnedFd`,
//! close-on-exec as `recvmsg(MSG_CMSG_CLOEXEC)` makes it).

use crate::wire::{self, Envelope, Reply, Request, WireError, MAX_FRAME};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Credentials of the process at the other end, as the kernel recorded them at `connect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id (in the arbiter's pid namespace).
    pub pid: u32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// `SO_PEERCRED` of a connected Unix stream.
pub fn peer_cred(s: &UnixStream) -> io::Result<PeerCred> {
    let c = rustix::net::sockopt::socket_peercred(s)?;
    Ok(PeerCred {
        pid: c.pid.as_raw_nonzero().get() as u32,
        uid: c.uid.as_raw(),
        gid: c.gid.as_raw(),
    })
}

/// Sends one framed message, with `fd` as `SCM_RIGHTS` when given (attached to the first byte).
pub fn send_with_fd<T: serde::Serialize>(
    s: &UnixStream,
    msg: &T,
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
    send_with_fds(s, msg, &fds)
}

/// Most fds one message carries: the grant page and the GPU's turn board.
pub const MAX_FDS: usize = 2;

/// Sends one framed message with up to [`MAX_FDS`] fds as `SCM_RIGHTS` (attached to the first
/// byte, in order; more is an `InvalidInput` error).
pub fn send_with_fds<T: serde::Serialize>(
    s: &UnixStream,
    msg: &T,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} fds in one message (at most {MAX_FDS})", fds.len()),
        ));
    }
    let bytes = wire::encode(msg);
    let mut sent = 0;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    while sent < bytes.len() {
        let mut ctl = SendAncillaryBuffer::new(&mut space);
        if sent == 0 && !fds.is_empty() {
            ctl.push(SendAncillaryMessage::ScmRights(fds));
        }
        match rustix::net::sendmsg(
            s,
            &[IoSlice::new(&bytes[sent..])],
            &mut ctl,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => sent += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Receives one framed message and the first fd (if any) that came with it.
pub fn recv_with_fd<T: serde::de::DeserializeOwned>(
    s: &UnixStream,
    max: usize,
) -> Result<(T, Option<OwnedFd>), WireError> {
    recv_with_fds(s, max).map(|(m, fds)| (m, fds.into_iter().next()))
}

/// Receives one framed message and the fds (at most [`MAX_FDS`], in the order sent) that came
/// with it.
pub fn recv_with_fds<T: serde::de::DeserializeOwned>(
    s: &UnixStream,
    max: usize,
) -> Result<(T, Vec<OwnedFd>), WireError> {
    let mut head = [0u8; 4];
    let mut got = 0;
    let mut got_fds: Vec<OwnedFd> = Vec::new();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 1))];
    // The fd is attached to the first byte of the frame: take it with the length prefix.
    while got < 4 {
        let mut ctl = RecvAncillaryBuffer::new(&mut space);
        let r = rustix::net::recvmsg(
            s,
            &mut [IoSliceMut::new(&mut head[got..])],
            &mut ctl,
            RecvFlags::CMSG_CLOEXEC,
        );
        let n = match r {
            // The kernel could not hand over every fd that came (this process is out of file
            // descriptors): what the message says of them would be wrong (found by review,
            // 2026-11-29; a grant without its page, an attach taken for news of none).
            Ok(m) if m.flags.contains(rustix::net::ReturnFlags::CTRUNC) => {
                return Err(WireError::Io(io::Error::other(
                    "the file descriptors sent with the message could not all be received (out of file descriptors?)",
                )))
            }
            Ok(m) => m.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(WireError::Io(e.into())),
        };
        for msg in ctl.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for f in fds {
                    // Keep the first MAX_FDS; extra fds (never sent by smore) are closed on drop.
                    if got_fds.len() < MAX_FDS {
                        got_fds.push(f);
                    }
                }
            }
        }
        if n == 0 {
            return Err(if got == 0 {
                WireError::Closed
            } else {
                WireError::Malformed("truncated length prefix".into())
            });
        }
        got += n;
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len];
    (&*s).read_exact(&mut body).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            WireError::Malformed(format!("truncated frame: expected {len} bytes"))
        } else {
            WireError::Io(e)
        }
    })?;
    Ok((wire::decode(&body)?, got_fds))
}

/// A client connection to the arbiter.
pub struct Client {
    stream: UnixStream,
}

impl Client {
    /// Connects to the arbiter socket at `path`.
    pub fn connect(path: &Path) -> io::Result<Client> {
        Ok(Client {
            stream: UnixStream::connect(path)?,
        })
    }

    /// Wraps an already connected stream (e.g. the one `smore run` hands down).
    pub fn from_stream(stream: UnixStream) -> Client {
        Client { stream }
    }

    /// The underlying socket (for timeouts, polling).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// The socket, e.g. to hand it to an exec'd command.
    pub fn into_stream(self) -> UnixStream {
        self.stream
    }

    /// Sends `req` and waits for the reply (and the fd that may come with it).
    pub fn call_with_fd(&self, req: Request) -> Result<(Reply, Option<OwnedFd>), WireError> {
        send_with_fd(&self.stream, &Envelope::new(req), None).map_err(WireError::from)?;
        recv_with_fd(&self.stream, MAX_FRAME)
    }

    /// Sends `req` and waits for the reply and every fd that came with it (a grant: its page,
    /// then the GPU's turn board when [`crate::wire::Grant::board`] says one follows).
    pub fn call_with_fds(&self, req: Request) -> Result<(Reply, Vec<OwnedFd>), WireError> {
        send_with_fd(&self.stream, &Envelope::new(req), None).map_err(WireError::from)?;
        recv_with_fds(&self.stream, MAX_FRAME)
    }

    /// Sends `req` and waits for the reply.
    pub fn call(&self, req: Request) -> Result<Reply, WireError> {
        Ok(self.call_with_fd(req)?.0)
    }
}

impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

/// Why a client could not connect to the arbiter at `path`, and what to do about it: a permission
/// problem (the socket's `socket_mode`/`socket_group`) is not an arbiter that is down.
pub fn unreachable_reason(path: &Path, e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::PermissionDenied {
        format!(
            "permission denied connecting to the arbiter at {}: this user may not use its socket \
             — the operator gives access with `socket_group` (and `socket_mode`, default 0660) in \
             the [arbiter] section of node.toml; add this user to that group and log in again, \
             or run as root",
            path.display()
        )
    } else {
        format!(
            "cannot reach the arbiter at {}: {e} (is `smore arbiter` running? set --socket or \
             SMORE_ARBITER_SOCKET if it listens elsewhere)",
            path.display()
        )
    }
}

/// The arbiter socket a client connects to: `explicit` (a `--socket` flag), else
/// `$SMORE_ARBITER_SOCKET`, else the default path.
pub fn socket_path(explicit: Option<&Path>) -> std::path::PathBuf {
    explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(wire::ENV_SOCKET).map(std::path::PathBuf::from))
        .unwrap_or_else(|| std::path::PathBuf::from(wire::DEFAULT_SOCKET))
}

#[cfg(test)]
mod reason_tests {
    use super::*;

    #[test]
    fn a_permission_problem_is_not_reported_as_a_stopped_arbiter() {
        let p = Path::new("/run/smore/arbiter.sock");
        let denied = unreachable_reason(p, &io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(denied.contains("permission denied") && denied.contains("socket_group"));
        assert!(!denied.contains("running?"), "{denied}");
        let gone = unreachable_reason(p, &io::Error::from(io::ErrorKind::NotFound));
        assert!(gone.contains("is `smore arbiter` running?"), "{gone}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Grant, MAX_REQUEST_FRAME};
    use std::io::Write;

    #[test]
    fn a_reply_carries_an_fd_and_the_peer_is_identified_by_the_kernel() {
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(peer_cred(&a).unwrap().pid, std::process::id());
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"page").unwrap();
        let reply = Reply::Granted(Grant {
            instance: 1,
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            memory_cap: 1,
            sm_share: 50,
            generation: 1,
            predicted_train: None,
            predicted_fn: None,
            rule: String::new(),
            failure_policy: None,
            pid: None,
            board: false,
        });
        send_with_fd(&a, &reply, Some(file.as_fd())).unwrap();
        let (got, fd): (Reply, _) = recv_with_fd(&b, MAX_FRAME).unwrap();
        assert_eq!(got, reply);
        let mut f = std::fs::File::from(fd.expect("fd passed"));
        use std::io::{Seek, SeekFrom};
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "page");
        // A message without an fd.
        send_with_fd(&a, &Envelope::new(Request::Status), None).unwrap();
        let (env, fd): (Envelope, _) = recv_with_fd(&b, MAX_REQUEST_FRAME).unwrap();
        assert_eq!(env.req, Request::Status);
        assert!(fd.is_none());
        drop(a);
        assert!(matches!(
            recv_with_fd::<Envelope>(&b, MAX_FRAME),
            Err(WireError::Closed)
        ));
    }
}
