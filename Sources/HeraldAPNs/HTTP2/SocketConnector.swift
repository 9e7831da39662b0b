import Foundation
import HeraldRuntime

/// A resolved socket address.
struct SocketAddress: @unchecked Sendable {  // @unchecked: a plain C value (sockaddr_storage) copied by value.
    var storage = sockaddr_storage()
    var length: socklen_t = 0
    var family: Int32 { Int32(storage.ss_family) }

    /// The numeric address, for messages.
    var text: String {
        var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
        var copy = storage
        let status = withUnsafePointer(to: &copy) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                getnameinfo($0, length, &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST)
            }
        }
        return status == 0 ? String(decoding: host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
    }
}

/// Opening the TCP side of a connection: resolving a host (getaddrinfo blocks, so off the loop thread) and
/// starting a non-blocking connect to one of its addresses.
enum SocketConnector {
    /// The addresses of all `hosts`, families alternating (IPv6, IPv4, IPv6, … when the first is IPv6), so that
    /// a family that does not work costs one address's attempt before the other is tried (RFC 8305).
    /// A host that does not resolve is left out; the first failure is the answer when none does.
    static func resolve(hosts: [String], port: UInt16) -> Result<[SocketAddress], APNsError> {
        var all: [SocketAddress] = []
        var firstFailure: APNsError?
        for host in hosts {
            switch resolve(host: host, port: port) {
            case .success(let addresses): all += addresses
            case .failure(let error): firstFailure = firstFailure ?? error
            }
        }
        if all.isEmpty, let firstFailure { return .failure(firstFailure) }
        return .success(alternatingFamilies(all))
    }

    static func alternatingFamilies(_ addresses: [SocketAddress]) -> [SocketAddress] {
        guard let first = addresses.first?.family else { return addresses }
        let preferred = addresses.filter { $0.family == first }, others = addresses.filter { $0.family != first }
        var ordered: [SocketAddress] = []
        for index in 0..<max(preferred.count, others.count) {
            if index < preferred.count { ordered.append(preferred[index]) }
            if index < others.count { ordered.append(others[index]) }
        }
        return ordered
    }

    private static func resolve(host: String, port: UInt16) -> Result<[SocketAddress], APNsError> {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_family = AF_UNSPEC
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &list)
        guard status == 0, let list else {
            return .failure(APNsError(.connectionFailed, "cannot resolve \(host): \(String(cString: gai_strerror(status)))"))
        }
        defer { freeaddrinfo(list) }
        var addresses: [SocketAddress] = []
        var cursor: UnsafeMutablePointer<addrinfo>? = list
        while let entry = cursor {
            if let address = entry.pointee.ai_addr, Int(entry.pointee.ai_addrlen) <= MemoryLayout<sockaddr_storage>.size {
                var resolved = SocketAddress()
                withUnsafeMutableBytes(of: &resolved.storage) { target in
                    target.copyMemory(from: UnsafeRawBufferPointer(start: address, count: Int(entry.pointee.ai_addrlen)))
                }
                resolved.length = entry.pointee.ai_addrlen
                addresses.append(resolved)
            }
            cursor = entry.pointee.ai_next
        }
        return addresses.isEmpty ? .failure(APNsError(.connectionFailed, "no address for \(host)")) : .success(addresses)
    }

    /// A non-blocking socket with a connect under way (or done) to `address`; the caller waits for it to become
    /// writable, then reads `pendingError`.
    static func startConnecting(to address: SocketAddress, endpoint: APNsEndpoint) -> Result<Int32, APNsError> {
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failure(APNsError(.connectionFailed, "socket: \(String(cString: strerror(errno)))")) }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var target = address
        let result = withUnsafePointer(to: &target.storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, address.length) }
        }
        guard result == 0 || errno == EINPROGRESS else {
            let message = "connect to \(endpoint): \(String(cString: strerror(errno)))"
            Glibc.close(fd)
            return .failure(APNsError(.connectionFailed, message))
        }
        return .success(fd)
    }

    /// The outcome of a finished non-blocking connect: nil when it succeeded.
    static func pendingError(_ fd: Int32, endpoint: APNsEndpoint) -> APNsError? {
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
        guard error != 0 else { return nil }
        return APNsError(.connectionFailed, "connect to \(endpoint): \(String(cString: strerror(error)))")
    }
}
