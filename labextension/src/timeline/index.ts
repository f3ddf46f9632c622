export * from './types';
export * from './layout';
export * from './render';
