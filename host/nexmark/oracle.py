# A second implementation of the Nexmark generator's documented draws, written from the docs of
# host/nexmark/src/generator.rs, independent of the Rust code: the oracle behind the table in the
# Nexmark source's tests (host/engine/src/connectors/nexmark.rs). Every choice is
# xxh3_64(index as LE u64 ++ salt as LE u64, seed) mapped to 0..n by (h * n) >> 64; salts are
# numbered from 1 in the order the generator lists them. Config: seed 7, max_disorder_ms 40,
# everything else at the defaults. Usage: pip install xxhash; python3 oracle.py 0 1 4 250000
import json, sys, xxhash
SEED, DISORDER, FIRST, STEP_US = 7, 40, 1_700_000_000_000, 100
SALT = {n: i + 1 for i, n in enumerate(
    "disorder first_name last_name email_user email_host credit_card city state hot_seller seller "
    "item_name description initial_bid reserve expires category hot_auction auction hot_bidder "
    "bidder hot_channel channel price".split())}
FIRST_NAMES = "Peter Paul Luke John Saul Vicky Kate Julie Sarah Deiter Walter".split()
LAST_NAMES = "Shultz Abrams Spencer White Bartels Walton Smith Jones Noris".split()
CITIES = ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"]
STATES, HOT_CHANNELS = "AZ CA ID OR WA WY".split(), "Google Facebook Baidu Apple".split()
h = lambda i, s: xxhash.xxh3_64_intdigest(i.to_bytes(8, "little") + SALT[s].to_bytes(8, "little"), SEED)
below = lambda x, n: (x * n) >> 64
def price(x): low = 100 * 10 ** below(x, 6); return low + x % (9 * low)
def event(i):
    epoch, off = divmod(i, 50)
    persons, auctions = epoch + min(off, 1), epoch * 3 + min(max(off - 1, 0), 3)
    t = FIRST + i * STEP_US // 1000 - below(h(i, "disorder"), DISORDER + 1)
    last_p, last_a = persons - 1, auctions - 1
    def active(salt):  # among the 1000 most recent persons
        people = last_p + 1; n = min(people, 1000); return people - n + below(h(i, salt), n)
    if off == 0:
        cc = h(i, "credit_card") % 10**16
        return dict(type="person", id=1000 + persons, date_time=t, state=STATES[below(h(i, "state"), 6)],
                    city=CITIES[below(h(i, "city"), 10)], credit_card=" ".join(f"{cc // 10**(4*g) % 10**4:04}" for g in (3, 2, 1, 0)),
                    name=FIRST_NAMES[below(h(i, "first_name"), 11)] + " " + LAST_NAMES[below(h(i, "last_name"), 9)])
    if off <= 3:
        seller = last_p // 100 * 100 if below(h(i, "hot_seller"), 4) > 0 else active("seller")
        initial = price(h(i, "initial_bid"))
        horizon_ms = (100 * 50 // 3) * STEP_US // 1000  # 100 auctions in flight
        return dict(type="auction", id=1000 + auctions, date_time=t, seller=1000 + seller, initial_bid=initial,
                    reserve=initial + price(h(i, "reserve")), category=10 + below(h(i, "category"), 5),
                    expires=t + 1 + below(h(i, "expires"), 2 * horizon_ms))
    if below(h(i, "hot_auction"), 2) > 0: auction = last_a // 100 * 100
    else: oldest = max(last_a + 1 - 100, 0); auction = oldest + below(h(i, "auction"), last_a - oldest + 1)
    bidder = min(last_p // 100 * 100 + 1, last_p) if below(h(i, "hot_bidder"), 4) > 0 else active("bidder")
    hot = below(h(i, "hot_channel"), 2) > 0
    channel = HOT_CHANNELS[below(h(i, "channel"), 4)] if hot else f"channel-{below(h(i, 'channel'), 10000)}"
    return dict(type="bid", auction=1000 + auction, bidder=1000 + bidder, price=price(h(i, "price")), channel=channel, date_time=t)
for i in map(int, sys.argv[1:]):
    print(i, json.dumps(event(i), separators=(",", ":")))
