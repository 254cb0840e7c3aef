// node-redis 5 with its client-side cache, driven step by step by tests/node_clients.rs:
// the test changes a key behind the application's back, and this script says how long
// the application's next reads took to see the change.
//
// usage: node watch.mjs <app host:port> <key>
// Prints one JSON line per step on stdout. First {"ready": value, "cached": bool} once the
// key is read (cached: its next read was served from the application's memory), or
// {"error": ...}. Then, for each line read on stdin (the value the key now has, as JSON: a
// string or null), it polls until a read gives that value and prints
// {"seen_ms": n, "last": value, "cached_again": bool} (seen_ms -1: not within 2 s;
// cached_again: reads are served from memory again after it). It ends with stdin.
import { createClient, BasicClientSideCache } from 'redis';
import readline from 'node:readline';

const [app_addr, key] = process.argv.slice(2);
const cache = new BasicClientSideCache({ ttl: 0, maxEntries: 0 });
const app = createClient({ url: `redis://${app_addr}`, RESP: 3, clientSideCache: cache });
app.on('error', (e) => { console.error('app client error', e); });
const say = (o) => console.log(JSON.stringify(o));

// Whether the next read of the key is a hit in the application's cache.
const cached = async () => {
  const hits = cache.stats().hitCount;
  await app.get(key);
  return cache.stats().hitCount > hits;
};

try {
  await app.connect();
  const first = await app.get(key);
  // A read before the proxy's tracking connection is up is invalidated at once: the
  // next one caches.
  const t = Date.now();
  while (!(await cached()) && Date.now() - t < 2000) await new Promise((r) => setTimeout(r, 5));
  say({ ready: first, cached: await cached() });
} catch (e) {
  say({ error: String((e && e.message) || e) });
  process.exit(0);
}

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  const want = JSON.parse(line);
  const t = Date.now();
  let seen = -1;
  let last;
  while (Date.now() - t < 2000) {
    last = await app.get(key);
    if (last === want) { seen = Date.now() - t; break; }
    await new Promise((r) => setTimeout(r, 2));
  }
  // Cached again after the change was seen: the next change is a real test.
  const s = Date.now();
  let again = false;
  while (seen >= 0 && !again && Date.now() - s < 2000) again = await cached();
  say({ seen_ms: seen, last, cached_again: again });
}
await app.quit();
