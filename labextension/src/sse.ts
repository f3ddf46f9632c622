// Server-Sent Events over fetch: an incremental parser and a reader for a streamed Response.
//
// EventSource cannot send Jupyter's auth headers nor POST a body, so the panel reads
// `text/event-stream` answers from `ServerConnection.makeRequest` itself. The parser follows
// https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation:
// lines end at CRLF, CR or LF (also when a chunk boundary splits a CRLF), `data:` lines of one
// event join with "\n", a line starting with ":" is a comment, one leading space after the
// colon is dropped, and an event is dispatched at a blank line.

/** One dispatched event. `event` defaults to "message", as in EventSource. */
export interface ISSEEvent {
  event: string;
  data: string;
  id: string | null;
}

export class SSEParser {
  private _buffer = '';
  private _data: string[] = [];
  private _event = '';
  private _id: string | null = null;
  private _lastId: string | null = null;
  private _sawCR = false;
  private _started = false;

  /** The last `id:` seen (the stream's "last event id"). */
  get lastEventId(): string | null {
    return this._lastId;
  }

  /** Feed decoded text; returns the events it completed. */
  push(chunk: string): ISSEEvent[] {
    if (!this._started && chunk.length) {
      this._started = true;
      if (chunk.charCodeAt(0) === 0xfeff) {
        chunk = chunk.slice(1);
      }
    }
    if (this._sawCR && chunk.startsWith('\n')) {
      chunk = chunk.slice(1); // the LF of a CRLF split over two chunks
    }
    this._sawCR = false;
    this._buffer += chunk;
    const out: ISSEEvent[] = [];
    let start = 0;
    for (let i = 0; i < this._buffer.length; i++) {
      const c = this._buffer[i];
      if (c !== '\n' && c !== '\r') {
        continue;
      }
      this._line(this._buffer.slice(start, i), out);
      if (c === '\r') {
        if (i + 1 === this._buffer.length) {
          this._sawCR = true;
        } else if (this._buffer[i + 1] === '\n') {
          i++;
        }
      }
      start = i + 1;
    }
    this._buffer = this._buffer.slice(start);
    return out;
  }

  /** The stream ended: an unterminated event is discarded, as the spec says. */
  end(): ISSEEvent[] {
    this._buffer = '';
    this._data = [];
    this._event = '';
    return [];
  }

  private _line(line: string, out: ISSEEvent[]): void {
    if (line === '') {
      if (this._data.length) {
        out.push({ event: this._event || 'message', data: this._data.join('\n'), id: this._id });
      }
      this._data = [];
      this._event = '';
      return;
    }
    if (line.startsWith(':')) {
      return;
    }
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) {
      value = value.slice(1);
    }
    switch (field) {
      case 'data':
        this._data.push(value);
        break;
      case 'event':
        this._event = value;
        break;
      case 'id':
        if (!value.includes('\0')) {
          this._id = value;
          this._lastId = value;
        }
        break;
      default:
        break; // `retry` and unknown fields: the panel reconnects on its own schedule
    }
  }
}

/**
 * Read a streamed `text/event-stream` Response, calling `onEvent` for each event as it
 * arrives. Resolves when the stream ends; rejects on a network error or abort.
 */
export async function readEventStream(
  response: Response,
  onEvent: (event: ISSEEvent) => void
): Promise<void> {
  if (!response.body) {
    throw new Error('The response has no body to stream.');
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SSEParser();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        break;
      }
      for (const event of parser.push(decoder.decode(value, { stream: true }))) {
        onEvent(event);
      }
    }
    for (const event of parser.push(decoder.decode())) {
      onEvent(event);
    }
  } finally {
    reader.releaseLock();
  }
}
