//! SCAN over a pool: the cursor the client sees carries the node it is on.
//!
//! client cursor = backend cursor * nodes + node. A scan walks node 0 to the end (its
//! cursor returns to 0), then node 1 from 0, and so on; the final 0 means every node is done.

/// Splits a client cursor into (node, backend cursor).
pub fn decode_cursor(cursor: u64, nodes: usize) -> (usize, u64) {
    let n = nodes.max(1) as u64;
    ((cursor % n) as usize, cursor / n)
}

/// The client cursor to return after node `node` answered `next`.
pub fn encode_cursor(next: u64, node: usize, nodes: usize) -> u64 {
    let n = nodes.max(1) as u64;
    if next == 0 {
        if node + 1 >= nodes {
            0
        } else {
            (node + 1) as u64
        }
    } else {
        // Backend cursors stay below the hash table size, far from overflow.
        next.saturating_mul(n).saturating_add(node as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_walks_every_node_then_ends() {
        assert_eq!(decode_cursor(0, 4), (0, 0));
        let c = encode_cursor(17, 2, 4);
        assert_eq!(decode_cursor(c, 4), (2, 17));
        assert_eq!(decode_cursor(encode_cursor(0, 2, 4), 4), (3, 0));
        assert_eq!(encode_cursor(0, 3, 4), 0);
    }

    #[test]
    fn single_node_cursor_is_the_backend_cursor() {
        assert_eq!(encode_cursor(42, 0, 1), 42);
        assert_eq!(decode_cursor(42, 1), (0, 42));
    }
}
