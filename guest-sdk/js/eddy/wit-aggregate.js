// The window-aggregate world's imports behind the host interface the aggregate runner uses.

import { installHost } from "./host.js";
import { common, number } from "./wit-common.js";

installHost({ aggregate: () => ({ ...common }), timestamp: number });
