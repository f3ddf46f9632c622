import { describe, expect, it } from 'vitest';
import { readEventStream, SSEParser } from '../src/sse';

const parseAll = (chunks: string[]) => {
  const parser = new SSEParser();
  return chunks.flatMap(c => parser.push(c));
};

describe('SSEParser', () => {
  it('parses the contract: token fragments with ids, then done', () => {
    const events = parseAll(['event: token\nid: req-1\ndata: Hello\n\nevent: token\nid: req-1\ndata:  world\n\nevent: done\ndata: [DONE]\n\n']);
    expect(events).toEqual([
      { event: 'token', data: 'Hello', id: 'req-1' },
      { event: 'token', data: ' world', id: 'req-1' }, // one leading space is the separator
      { event: 'done', data: '[DONE]', id: 'req-1' }
    ]);
  });

  it('joins several data lines with newlines (a fragment that holds line breaks)', () => {
    expect(parseAll(['event: token\ndata: alpha beta\ndata: gamma\ndata: \ndata: delta\n\n'])[0].data).toBe(
      'alpha beta\ngamma\n\ndelta'
    );
  });

  it('takes CRLF, CR and LF line ends, also a CRLF split between chunks', () => {
    const events = parseAll(['data: a\r', '\n\r\ndata: b\r\rdata: c\n', '\n']);
    expect(events.map(e => e.data)).toEqual(['a', 'b', 'c']);
  });

  it('dispatches only at the blank line, however the text is chunked', () => {
    const text = 'event: result\ndata: {"id": "req-9", "text": "hi"}\n\n';
    for (let cut = 1; cut < text.length; cut++) {
      const events = parseAll([text.slice(0, cut), text.slice(cut)]);
      expect(events).toHaveLength(1);
      expect(JSON.parse(events[0].data).id).toBe('req-9');
    }
  });

  it('ignores comments (keepalives), unknown fields and a leading BOM', () => {
    const events = parseAll(['\ufeff: ok\n\n', ': keepalive\n\nretry: 10\nfoo: bar\nevent: queued\ndata: {}\n\n']);
    expect(events).toEqual([{ event: 'queued', data: '{}', id: null }]);
  });

  it('defaults the event name to "message" and drops an event the stream cut off', () => {
    const parser = new SSEParser();
    expect(parser.push('data: x\n\ndata: half')).toEqual([{ event: 'message', data: 'x', id: null }]);
    expect(parser.end()).toEqual([]);
  });
});

describe('readEventStream', () => {
  it('reads a streamed Response as events arrive, across multi-byte characters', async () => {
    const bytes = new TextEncoder().encode('event: token\ndata: caf\u00e9 \u2615\n\nevent: done\ndata: [DONE]\n\n');
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let i = 0; i < bytes.length; i += 5) {
          controller.enqueue(bytes.slice(i, i + 5)); // splits the UTF-8 sequences
        }
        controller.close();
      }
    });
    const seen: string[] = [];
    await readEventStream(new Response(body), e => seen.push(`${e.event}:${e.data}`));
    expect(seen).toEqual(['token:caf\u00e9 \u2615', 'done:[DONE]']);
  });
});
