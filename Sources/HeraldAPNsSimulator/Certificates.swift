import HeraldCrypto
import Foundation
import HeraldRuntime
internal import COpenSSL

/// The simulator's own TLS material, made with OpenSSL's X509 API: a CA and a server certificate it signed.
public enum SimulatorCertificates {
    /// Paths of the files `generate` writes into a directory.
    public struct Files: Sendable, Equatable {
        /// The CA certificate clients trust (`HERALD_APNS_CA_FILE`, `curl --cacert`).
        public var caCertificate: String
        /// The server certificate followed by the CA certificate (the chain the server presents).
        public var serverCertificate: String
        /// The server's private key (mode 0600).
        public var serverKey: String

        public init(directory: String) {
            caCertificate = directory + "/ca.pem"
            serverCertificate = directory + "/server.pem"
            serverKey = directory + "/server-key.pem"
        }

        /// True when all three files exist.
        public var exist: Bool {
            [caCertificate, serverCertificate, serverKey].allSatisfy { FileManager.default.fileExists(atPath: $0) }
        }
    }

    public struct Failure: Error, CustomStringConvertible {
        public var message: String
        public var description: String { message }
    }

    /// Writes `ca.pem`, `server.pem` and `server-key.pem` into `directory` (created if needed): P-256 keys, a
    /// CA valid for `days`, and a server certificate for `dnsNames` and `ipAddresses` (subjectAltName).
    @discardableResult
    public static func generate(directory: String, dnsNames: [String] = ["localhost"],
                                ipAddresses: [String] = ["127.0.0.1", "::1"], days: Int = 825) throws -> Files {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let files = Files(directory: directory)
        let caKey = try Key.generate()
        let ca = try Certificate(subject: "Herald APNs simulator CA", issuer: nil, key: caKey, signer: caKey,
                                 days: days, extensions: [
                                    (NID_basic_constraints, "critical,CA:TRUE,pathlen:0"),
                                    (NID_key_usage, "critical,keyCertSign,cRLSign"),
                                    (NID_subject_key_identifier, "hash"),
                                 ])
        let serverKey = try Key.generate()
        let names = dnsNames.map { "DNS:" + $0 } + ipAddresses.map { "IP:" + $0 }
        let server = try Certificate(subject: dnsNames.first ?? ipAddresses.first ?? "localhost", issuer: ca,
                                     key: serverKey, signer: caKey, days: days, extensions: [
                                        (NID_basic_constraints, "critical,CA:FALSE"),
                                        (NID_key_usage, "critical,digitalSignature,keyEncipherment"),
                                        (NID_ext_key_usage, "serverAuth"),
                                        (NID_subject_alt_name, names.joined(separator: ",")),
                                        (NID_subject_key_identifier, "hash"),
                                        (NID_authority_key_identifier, "keyid:always"),
                                     ])
        try write(ca.pem, to: files.caCertificate, mode: 0o644)
        try write(server.pem + ca.pem, to: files.serverCertificate, mode: 0o644)
        try write(serverKey.pem, to: files.serverKey, mode: 0o600)
        return files
    }

    private static func write(_ text: String, to path: String, mode: mode_t) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { throw Failure(message: "cannot write \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        fchmod(fd, mode)
        let bytes = Array(text.utf8)
        guard bytes.withUnsafeBytes({ Foundation.write(fd, $0.baseAddress, $0.count) }) == bytes.count else {
            throw Failure(message: "cannot write \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// An EVP_PKEY with one owner.
    final class Key {
        let pointer: OpaquePointer
        private init(_ pointer: OpaquePointer) { self.pointer = pointer }
        deinit { EVP_PKEY_free(pointer) }

        static func generate() throws -> Key {
            guard let context = EVP_PKEY_CTX_new_id(EVP_PKEY_EC, nil) else { throw Failure(message: "keygen context") }
            defer { EVP_PKEY_CTX_free(context) }
            var key: OpaquePointer?
            guard EVP_PKEY_keygen_init(context) == 1,
                  EVP_PKEY_CTX_set_ec_paramgen_curve_nid(context, NID_X9_62_prime256v1) == 1,
                  EVP_PKEY_keygen(context, &key) == 1, let key else { throw Failure(message: "key generation failed") }
            return Key(key)
        }

        var pem: String { PEMWriter.write { PEM_write_bio_PrivateKey($0, pointer, nil, nil, 0, nil, nil) } }
    }

    /// An X509 with one owner.
    final class Certificate {
        let pointer: OpaquePointer

        init(subject: String, issuer: Certificate?, key: Key, signer: Key, days: Int,
             extensions: [(Int32, String)]) throws {
            guard let certificate = X509_new() else { throw Failure(message: "X509_new failed") }
            pointer = certificate
            guard X509_set_version(certificate, 2) == 1 else { throw Failure(message: "X509_set_version failed") }
            // A random 127-bit serial: positive, unique per certificate (RFC 5280 asks for ≤ 20 octets).
            guard let serial = BN_new() else { throw Failure(message: "BN_new failed") }
            defer { BN_free(serial) }
            guard BN_rand(serial, 127, -1, 0) == 1,
                  BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(certificate)) != nil else {
                throw Failure(message: "serial number")
            }
            // Valid from an hour ago so a client whose clock is slightly behind still accepts it.
            guard X509_gmtime_adj(X509_getm_notBefore(certificate), -3600) != nil,
                  X509_gmtime_adj(X509_getm_notAfter(certificate), days * 86_400) != nil else {
                throw Failure(message: "validity")
            }
            guard X509_set_pubkey(certificate, key.pointer) == 1 else { throw Failure(message: "X509_set_pubkey failed") }
            let name = X509_get_subject_name(certificate)
            guard X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, "Herald", -1, -1, 0) == 1,
                  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, subject, -1, -1, 0) == 1 else {
                throw Failure(message: "subject name")
            }
            let issuerName = issuer.map { X509_get_subject_name($0.pointer) } ?? name
            guard X509_set_issuer_name(certificate, issuerName) == 1 else { throw Failure(message: "issuer name") }

            var context = X509V3_CTX()
            X509V3_set_ctx(&context, issuer?.pointer ?? certificate, certificate, nil, nil, 0)
            for (nid, value) in extensions {
                guard let ext = X509V3_EXT_conf_nid(nil, &context, nid, value) else {
                    throw Failure(message: "extension \(value)")
                }
                defer { X509_EXTENSION_free(ext) }
                guard X509_add_ext(certificate, ext, -1) == 1 else { throw Failure(message: "extension \(value)") }
            }
            guard X509_sign(certificate, signer.pointer, EVP_sha256()) > 0 else { throw Failure(message: "X509_sign failed") }
        }

        deinit { X509_free(pointer) }

        var pem: String { PEMWriter.write { PEM_write_bio_X509($0, pointer) } }
    }
}
