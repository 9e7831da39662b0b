internal import CRdKafka

/// Owns one `rd_kafka_topic_partition_list_t`; destroys it in `deinit`.
final class RDKafkaTopicPartitionList {
    struct Entry {
        var position: KafkaTopicPartitionOffset
        var error: rd_kafka_resp_err_t
    }

    let pointer: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>

    init(_ positions: [KafkaTopicPartitionOffset]) {
        pointer = rd_kafka_topic_partition_list_new(Int32(clamping: positions.count))
        for position in positions {
            rd_kafka_topic_partition_list_add(pointer, position.topic, position.partition).pointee.offset = position.offset
        }
    }

    deinit { rd_kafka_topic_partition_list_destroy(pointer) }

    var entries: [Entry] { Self.entries(of: pointer) }

    /// Throws the first per-partition error, naming the partition.
    func checkErrors(_ what: String) throws(KafkaError) {
        for entry in entries where entry.error != RD_KAFKA_RESP_ERR_NO_ERROR {
            throw KafkaError(entry.error, message: "\(what) \(entry.position.topicPartition): "
                             + String(cString: rd_kafka_err2str(entry.error)))
        }
    }

    static func entries(of list: UnsafePointer<rd_kafka_topic_partition_list_t>) -> [Entry] {
        (0..<Int(list.pointee.cnt)).map { index in
            let element = list.pointee.elems[index]
            return Entry(position: KafkaTopicPartitionOffset(topic: String(cString: element.topic),
                                                             partition: element.partition, offset: element.offset),
                         error: element.err)
        }
    }
}
