/// Delayed answers in due order. Taking the due ones off the front moves nothing until half the storage is spent
/// (thousands wait under a configured delay), and the dues sit in their own array, so that finding a new answer's
/// place copies no answer.
struct DueQueue<Element> {
    private var dues: [ContinuousClock.Instant] = []
    private var elements: [Element] = []
    private var head = 0

    var isEmpty: Bool { head == dues.count }
    var firstDue: ContinuousClock.Instant? { isEmpty ? nil : dues[head] }

    mutating func insert(_ element: Element, due: ContinuousClock.Instant) {
        // Binary search from the end's side: with one fixed delay every new element goes last.
        var low = head, high = dues.count
        while low < high {
            let middle = (low + high) / 2
            if dues[middle] <= due { low = middle + 1 } else { high = middle }
        }
        dues.insert(due, at: low)
        elements.insert(element, at: low)
    }

    /// Removes and returns the elements due at `now` (all of them with nil), in due order.
    mutating func takeDue(at now: ContinuousClock.Instant?) -> [Element] {
        var end = head
        while end < dues.count, now.map({ dues[end] <= $0 }) ?? true { end += 1 }
        // A copy of the few taken, not a slice: a slice would share the storage, and emptying it below would then
        // allocate new storage of the whole capacity on every call.
        let taken = Array(elements[head..<end])
        head = end
        if head == dues.count {
            dues.removeAll(keepingCapacity: true)
            elements.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 1024, head * 2 >= dues.count {
            dues.removeFirst(head)
            elements.removeFirst(head)
            head = 0
        }
        return taken
    }
}
