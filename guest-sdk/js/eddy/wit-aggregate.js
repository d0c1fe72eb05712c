// @ts-check
// The window-aggregate world's imports behind the host interface the aggregate runner uses.

import { installHost } from "./host.js";
import { common, number } from "./wit-common.js";

// An aggregate has no clock (its world imports none); QuickJS's Date.now() would trap.
Date.now = () => {
  throw new Error("an aggregate has no clock: use the records' timestamps");
};

installHost({ aggregate: () => ({ ...common }), timestamp: number });
