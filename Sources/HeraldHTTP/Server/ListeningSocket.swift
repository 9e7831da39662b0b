import Foundation
import HeraldRuntime
import Synchronization

/// A bound, listening TCP socket, owned here until the worker loops take it over.
///
/// The server binds in its initializer (so a taken port fails at start-up, and port 0 reveals its real port
/// before `run()`), then hands the descriptor to the loops.
final class ListeningSocket: Sendable {
    private let descriptor: Int32
    private let owned = Atomic<Bool>(true)
    /// The address actually bound (the kernel's port when 0 was asked for).
    let localAddress: HostPort

    init(binding address: HostPort, backlog: Int32 = 1024) throws(HTTPServerError) {
        var hints = addrinfo()
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(address.host, String(address.port), &hints, &list)
        guard status == 0, let info = list else {
            throw HTTPServerError(.invalidAddress, "cannot resolve \(address): \(String(cString: gai_strerror(status)))")
        }
        defer { freeaddrinfo(list) }

        let fd = socket(info.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HTTPServerError(.bindFailed, "socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        guard bind(fd, info.pointee.ai_addr, info.pointee.ai_addrlen) == 0, listen(fd, backlog) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw HTTPServerError(.bindFailed, "cannot listen on \(address): \(reason)")
        }

        var bound = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let port = withUnsafeMutablePointer(to: &bound) { storage in
            storage.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        } == 0 ? Self.port(of: bound) : address.port
        descriptor = fd
        localAddress = HostPort(host: address.host, port: port)
    }

    /// Hands the descriptor over (to the worker loops, which close it from then on). `nil` if already taken.
    func take() -> Int32? {
        owned.exchange(false, ordering: .acquiringAndReleasing) ? descriptor : nil
    }

    deinit {
        if owned.load(ordering: .acquiring) { close(descriptor) }
    }

    private static func port(of storage: sockaddr_storage) -> UInt16 {
        var copy = storage
        return withUnsafePointer(to: &copy) { pointer in
            switch Int32(storage.ss_family) {
            case AF_INET:
                pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) }
            case AF_INET6:
                pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) }
            default:
                0
            }
        }
    }
}
