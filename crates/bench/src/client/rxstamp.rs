//! Kernel receive timestamps on observer sockets: when a receipt's bytes reached the socket,
//! beside when the harness got round to reading them.
//!
//! The gap between the two, plus the scheduler's send lag, is the time the harness itself adds
//! to a measurement: waking its thread, reading, parsing and recording. The target and the
//! network are outside it. Each read is stamped by the kernel (`SO_TIMESTAMPNS`: the arrival
//! of the last segment the read took, on the wall clock); the harness converts that to its
//! own clock by reading the wall clock at the moment it stamps the receipt, so a wall clock
//! slewed or stepped during a run moves nothing.
//!
//! The kernel turns stamping on a moment after the first socket on the machine asks for it
//! (from a work queue), so the first bytes may arrive unstamped. Such receipts are left out of
//! the harness's figures (`harness_samples` in meta.json counts the samples kept); observers
//! subscribe before the warm-up, so measured samples have their stamps.

use std::io;
use std::os::fd::RawFd;
use std::time::{SystemTime, UNIX_EPOCH};

/// Asks the kernel to stamp every segment that arrives on `fd`.
pub fn enable(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` outlives the call and its size is passed with it.
    let result = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Reads into `buf` (`recv`, without blocking when `nonblocking`); returns the bytes read and
/// the kernel's arrival time of what was read, in wall-clock nanoseconds, when it gave one.
pub fn recv(fd: RawFd, buf: &mut [u8], nonblocking: bool) -> io::Result<(usize, Option<u64>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for a few control messages; u64s keep it aligned for cmsghdr.
    let mut control = [0u64; 16];
    // SAFETY: an all-zero msghdr is valid; its pointers are set below to buffers that outlive
    // the call, with their lengths.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control) as _;
    let flags = if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    let read = loop {
        // SAFETY: `message` describes live buffers of the stated sizes.
        let read = unsafe { libc::recvmsg(fd, &mut message, flags) };
        if read >= 0 {
            break read;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    let mut arrived = None;
    // SAFETY: the CMSG_* helpers walk the control buffer the kernel filled, within
    // `msg_controllen`; the timestamp's bytes are read unaligned.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_TIMESTAMPNS {
                let stamp: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast());
                if stamp.tv_sec > 0 {
                    arrived = Some(stamp.tv_sec as u64 * 1_000_000_000 + stamp.tv_nsec as u64);
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    Ok((read as usize, arrived))
}

/// On the harness clock, when bytes stamped `arrived` (wall-clock ns) came in, given that the
/// harness stamps them `received_ns` now; 0 when the kernel gave no stamp.
pub fn arrival_on_clock(received_ns: u64, arrived: Option<u64>) -> u64 {
    let Some(arrived) = arrived else { return 0 };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64);
    received_ns.saturating_sub(now.saturating_sub(arrived)).max(1)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_read_carries_the_time_its_bytes_arrived() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (receiver, _) = listener.accept().unwrap();
        enable(receiver.as_raw_fd()).unwrap();
        let mut buf = [0u8; 16];
        // The kernel turns stamping on for the first socket that asks for it from a work queue,
        // a moment later: bytes that arrive before then carry no stamp.
        let mut primed = false;
        for _ in 0..200 {
            sender.write_all(b"p").unwrap();
            let (read, arrived) = recv(receiver.as_raw_fd(), &mut buf, false).unwrap();
            assert_eq!(&buf[..read], b"p");
            if arrived.is_some() {
                primed = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(primed, "the kernel never stamped a read");
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        sender.write_all(b"hello").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (read, arrived) = recv(receiver.as_raw_fd(), &mut buf, false).unwrap();
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        assert_eq!(&buf[..read], b"hello");
        let arrived = arrived.expect("the kernel stamps the read");
        // Stamped when the bytes came, not when they were read 20 ms later.
        assert!(arrived >= before && arrived + 15_000_000 < after, "{before} {arrived} {after}");
        // On the harness clock: read "now" at 1 s, so it came ~20 ms earlier.
        let on_clock = arrival_on_clock(1_000_000_000, Some(arrived));
        assert!((950_000_000..=985_000_000).contains(&on_clock), "{on_clock}");
        // Without timestamps on, nothing is made up.
        assert_eq!(arrival_on_clock(1_000_000_000, None), 0);
        let (plain_sender, plain_receiver) = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            (sender, listener.accept().unwrap().0)
        };
        (&plain_sender).write_all(b"y").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (read, arrived) = recv(plain_receiver.as_raw_fd(), &mut buf, false).unwrap();
        assert_eq!((read, arrived), (1, None));
    }
}
