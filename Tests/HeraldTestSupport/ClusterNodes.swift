/// A Redis Cluster master as `CLUSTER NODES` lists it: its id, port and the slot ranges it serves.
public struct ClusterMaster: Sendable {
    public let id: String
    public let port: Int
    public let slots: [ClosedRange<Int>]

    public func serves(_ slot: Int) -> Bool { slots.contains { $0.contains(slot) } }

    /// The masters in `CLUSTER NODES` output that serve slots and are not marked failed; slots being imported or
    /// migrated (`[…]`) are left out.
    public static func parse(clusterNodes output: String) -> [ClusterMaster] {
        output.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ")
            guard fields.count >= 8, fields[2].contains("master"), !fields[2].contains("fail"),
                  let port = fields[1].split(separator: "@").first?.split(separator: ":").last.flatMap({ Int($0) })
            else { return nil }
            let slots = fields.dropFirst(8).compactMap { range -> ClosedRange<Int>? in
                let bounds = range.split(separator: "-").compactMap { Int($0) }
                if bounds.count == 2 { return bounds[0]...bounds[1] }
                return bounds.count == 1 && !range.hasPrefix("[") ? bounds[0]...bounds[0] : nil
            }
            return slots.isEmpty ? nil : ClusterMaster(id: String(fields[0]), port: port, slots: slots)
        }
    }
}
