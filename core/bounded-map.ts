/**
 * A cache keyed by what clients choose (a model name under a wildcard route, an image size): past
 * `limit` entries it starts over, so made-up keys cannot grow the process for the life of the
 * process, while the keys in use fill it again at once.
 */
export class BoundedMap<K, V> extends Map<K, V> {
  constructor(private readonly limit: number) {
    super();
  }

  override set(key: K, value: V): this {
    if (this.size >= this.limit && !this.has(key)) this.clear();
    return super.set(key, value);
  }
}
